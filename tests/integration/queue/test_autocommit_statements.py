"""How ``autocommit`` sends a statement: its named parameters as ``$n`` once, literal ``%``
kept, a long statement as well as a short one, a missing parameter a database error."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from runyard.platform.db import autocommit


def test_autocommit__a_statement_past_the_drivers_parse_cache_runs_with_its_parameters(
    engine: Engine,
):
    # Longer than the 4 KiB psycopg caches the parse of; each parameter used more than once.
    padding = " ".join(f"/* {i:05d} */" for i in range(500))
    statement = text(f"SELECT :a || :b || :a AS joined, format('%s!', :b) AS pct {padding}")
    for a, b in (("x", "y"), ("p", "q")):
        row = autocommit(engine, statement, {"a": a, "b": b})[0]
        assert (row.joined, row.pct) == (a + b + a, b + "!")


def test_autocommit__a_missing_parameter_is_a_database_error_and_the_pool_stays_usable(
    engine: Engine,
):
    with pytest.raises(DBAPIError, match="query parameter missing: b"):
        autocommit(engine, text("SELECT :a AS a, :b AS b"), {"a": 1})
    assert autocommit(engine, text("SELECT :a AS a"), {"a": 1})[0].a == 1
