"""Which database a benchmark uses: a benchmark run with no flags brings its own."""

from __future__ import annotations

import pytest

from bench.common import DatabaseChoice, base_parser, choose_database

GIVEN = "postgresql://u@127.0.0.1:5432/given"
FROM_ENV = "postgresql://u@127.0.0.1:5432/from_env"
SERVER = "postgresql://postgres@127.0.0.1:55432/postgres"


@pytest.mark.parametrize(
    ("database_url", "server_url", "env", "expected"),
    [
        (None, None, {}, DatabaseChoice("embedded", None)),
        (None, None, {"RUNYARD_DATABASE_URL": ""}, DatabaseChoice("embedded", None)),
        (None, SERVER, {}, DatabaseChoice("server", SERVER)),
        (None, None, {"RUNYARD_DATABASE_URL": FROM_ENV}, DatabaseChoice("given", FROM_ENV)),
        (None, SERVER, {"RUNYARD_DATABASE_URL": FROM_ENV}, DatabaseChoice("given", FROM_ENV)),
        (GIVEN, None, {"RUNYARD_DATABASE_URL": FROM_ENV}, DatabaseChoice("given", GIVEN)),
        (GIVEN, SERVER, {}, DatabaseChoice("given", GIVEN)),
        ("", None, {}, DatabaseChoice("embedded", None)),
    ],
)
def test_choose_database__table(
    database_url: str | None, server_url: str | None, env: dict[str, str], expected: DatabaseChoice
):
    assert choose_database(database_url, server_url, env) == expected


def test_bench_parser__no_flags_means_no_url_at_all():
    args = base_parser("x", None).parse_args([])
    assert args.database_url is None and args.server_url is None
    assert choose_database(args.database_url, args.server_url, {}).kind == "embedded"
