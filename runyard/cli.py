"""The ``runyard`` console script: service commands, migrations and API keys.

The core does not import the services: their entry points are loaded by name when asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

from runyard.settings import Settings

SERVICES = {
    "api": ("api.__main__", "serve the HTTP API"),
    "worker": ("worker.__main__", "run a worker (claims, runs containers, heartbeats)"),
    "reaper": ("reaper.__main__", "run the stale-lease reaper"),
    "dev": ("api.dev", "API + worker + reaper in one process, embedded Postgres if needed"),
}


def _service_main(module: str) -> Callable[[Sequence[str]], int]:
    return cast(Callable[[Sequence[str]], int], importlib.import_module(module).main)


def _migrate(args: argparse.Namespace) -> int:
    from runyard.db import migrate

    settings = Settings()
    migrate(settings.database_url, args.revision)
    print(f"database migrated to {args.revision}")  # noqa: T201
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from runyard.auth import create_api_key
    from runyard.db import make_engine

    engine = make_engine(Settings().database_url, pool_size=1, max_overflow=0)
    try:
        key = create_api_key(engine, args.tenant, admin=args.admin, name=args.name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    finally:
        engine.dispose()
    print(key)  # noqa: T201
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand that is not a service."""
    parser = argparse.ArgumentParser(prog="runyard", description="runyard tool execution platform")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in SERVICES.items():
        sub.add_parser(name, help=help_text, add_help=False)
    migrate = sub.add_parser("migrate", help="upgrade the database schema (alembic upgrade)")
    migrate.add_argument("revision", nargs="?", default="head")
    migrate.set_defaults(func=_migrate)
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--admin", action="store_true", help="the key sees every tenant")
    create.add_argument("--name", help="a label for the key")
    create.set_defaults(func=_keys_create)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a service's ``main`` or run a management command."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SERVICES:
        module, _ = SERVICES[args_list[0]]
        return _service_main(module)(args_list[1:])
    args = build_parser().parse_args(args_list)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
