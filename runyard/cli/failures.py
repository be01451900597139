"""What the console script says, on one line, about an error no command handled itself, and
the exit code it leaves with: a person reads the line, a script reads the code."""

from __future__ import annotations

from runyard.cli.common import EXIT_API_ERROR, EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE

DATABASE_SCHEMES = (
    "postgresql://",
    "postgres://",
    "postgresql+psycopg://",
    "postgresql+psycopg2://",
)


def database_url_problem(url: str) -> str | None:
    """Why the database commands cannot use ``url`` (``RUNYARD_DATABASE_URL``), or None."""
    if not url:
        return "RUNYARD_DATABASE_URL is not set (migrate, keys and the services need it)"
    if not url.startswith(DATABASE_SCHEMES):
        return "RUNYARD_DATABASE_URL is not a postgresql:// URL"
    return None


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, stripped (a driver's message spans several)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def describe_failure(error: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an error that escaped a command."""
    from sqlalchemy import exc as sa_exc

    if isinstance(error, sa_exc.DBAPIError):
        detail = first_line(str(error.orig if error.orig is not None else error))
        if isinstance(error, sa_exc.OperationalError):
            # psycopg reports a failure to connect (refused, no such host, bad password) so.
            return f"runyard: error: cannot use the database: {detail}", EXIT_UNREACHABLE
        if isinstance(error, sa_exc.ProgrammingError) and "does not exist" in detail:
            return (
                f"runyard: error: the database is not ready ({detail}); run `runyard migrate`",
                EXIT_API_ERROR,
            )
        return f"runyard: error: the database refused: {detail}", EXIT_API_ERROR
    if isinstance(error, sa_exc.ArgumentError):
        return f"runyard: error: bad database URL: {first_line(str(error))}", EXIT_USAGE
    if isinstance(error, BrokenPipeError):
        return "runyard: error: the output was closed", EXIT_FAILED
    if isinstance(error, OSError):
        return f"runyard: error: {error}", EXIT_USAGE
    name = type(error).__name__
    return (
        f"runyard: error: unexpected {name}: {first_line(str(error))} "
        "(RUNYARD_DEBUG=1 shows the traceback)",
        EXIT_FAILED,
    )
