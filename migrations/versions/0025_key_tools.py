"""A key may be limited to some tools: ``api_keys.tools`` (NULL: every tool, as before).

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27 07:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("tools", postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "tools")
