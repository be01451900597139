"""What ``runyard dev`` prints once it is up: where the API, dashboard, docs and database are."""

from __future__ import annotations

import pytest

from api.dev import banner_text, masked_database_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://runyard:s3cret@db:5432/runyard", "postgresql://runyard:***@db:5432/runyard"),
        ("postgresql://runyard@db/runyard", "postgresql://runyard@db/runyard"),
        (
            "postgresql://postgres:pw@/postgres?host=/tmp/pg",
            "postgresql://postgres:***@/postgres?host=%2Ftmp%2Fpg",
        ),
        ("not a url", "not a url"),
    ],
)
def test_masked_database_url__hides_only_the_password(url: str, shown: str):
    assert masked_database_url(url) == shown


def test_banner__names_api_dashboard_docs_and_the_masked_database():
    text = banner_text(
        "http://127.0.0.1:8000",
        "postgresql://runyard:s3cret@127.0.0.1:5432/runyard",
        "RUNYARD_DATABASE_URL",
        ["auth is OFF"],
    )
    assert "runyard dev is up at http://127.0.0.1:8000\n" in text
    assert "API:       http://127.0.0.1:8000/v1/\n" in text
    assert "dashboard: http://127.0.0.1:8000/ui/\n" in text
    assert "API docs:  http://127.0.0.1:8000/docs\n" in text
    assert "runyard:***@127.0.0.1:5432/runyard (RUNYARD_DATABASE_URL)" in text
    assert "s3cret" not in text
    assert text.endswith("  auth is OFF\n")
