"""The CLI's contract that needs no server: version, exit code table, usage errors."""

from __future__ import annotations

from importlib import metadata

import pytest

from runyard.cli import common as cli_common
from runyard.cli import main as cli


def test_cli_version__is_the_installed_distributions(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"runyard {metadata.version('runyard')}\n"


def test_cli_exit_codes__are_distinct_per_kind():
    codes = [
        cli_common.EXIT_OK,
        cli_common.EXIT_FAILED,
        cli_common.EXIT_USAGE,
        cli_common.EXIT_TIMED_OUT,
        cli_common.EXIT_CANCELLED,
        cli_common.EXIT_API_ERROR,
        cli_common.EXIT_UNREACHABLE,
        cli_common.EXIT_INTERRUPTED,
    ]
    assert len(set(codes)) == len(codes)
    assert cli_common.OUTCOME_EXIT == {"succeeded": 0, "failed": 1, "timed_out": 3, "cancelled": 4}


@pytest.mark.parametrize("command", [[], ["submit", "--help"], ["logs", "--help"]])
def test_cli_help__lists_every_exit_code(command: list[str], capsys: pytest.CaptureFixture[str]):
    if command:
        with pytest.raises(SystemExit):
            cli.main(command)
        text = capsys.readouterr().out
    else:
        text = cli.build_parser().format_help()
    for code in (0, 1, 2, 3, 4, 5, 6, 130):
        assert f"\n  {code} " in text, (code, text)


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "echo", "--input", "{not json"],
        ["submit", "echo", "--input", "@/nonexistent/input.json"],
        ["submit"],
        ["ls", "--limit", "many"],
        ["no-such-command"],
    ],
)
def test_cli_usage_error__exits_2_before_any_request(
    argv: list[str], capsys: pytest.CaptureFixture[str]
):
    # Port 9 on loopback: were a request made, the exit code would be 6, not 2.
    full = [*argv, "--url", "http://127.0.0.1:9"] if argv[0] in ("submit", "ls") else argv
    try:
        code = cli.main(full)
    except SystemExit as exc:
        code = int(str(exc.code))
    assert code == cli_common.EXIT_USAGE
    assert "Traceback" not in capsys.readouterr().err
