"""The CLI's contract that needs no server: version, exit code table, usage errors, and how
it waits (against the SDK's in-memory API)."""

from __future__ import annotations

from importlib import metadata

import httpx2
import pytest

from runyard.cli import common as cli_common
from runyard.cli import main as cli
from runyard.cli import waiting
from runyard_client import (
    ArtifactIntegrityError,
    InvalidResponseError,
    NotFoundError,
    Runyard,
    RunyardError,
    UnavailableError,
)
from runyard_client.testing import FAKE_URL, FakeBackend, fake_transport


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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_patience__bears_trouble_that_passes_for_its_window_only():
    clock = Clock()
    patience = waiting.Patience(60.0, clock)
    down = UnavailableError("cannot reach the runyard API")
    patience.failed(down)
    clock.now = 60.0
    patience.failed(down)
    clock.now = 60.5
    with pytest.raises(UnavailableError):
        patience.failed(down)
    patience.recovered()
    clock.now = 200.0
    patience.failed(UnavailableError("proxy", status=503))  # a new window
    with pytest.raises(NotFoundError):
        patience.failed(NotFoundError("gone", status=404))  # never borne


class Flaky(httpx2.BaseTransport):
    """The fake API, unreachable for ``drops`` requests after the first."""

    def __init__(self, inner: httpx2.BaseTransport, drops: int) -> None:
        self.inner, self.drops = inner, drops
        self.seen: list[httpx2.Request] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(request)
        if len(self.seen) > 1 and self.drops > 0:
            self.drops -= 1
            raise httpx2.ConnectError("connection refused (injected)", request=request)
        return self.inner.handle_request(request)


def test_wait_for_run__long_polls_one_keyed_submit_through_an_outage_to_the_end():
    transport = Flaky(fake_transport(FakeBackend({"echo": lambda value: value})), drops=2)
    updates: list[str] = []
    pauses: list[float] = []
    with Runyard(FAKE_URL, max_retries=0, transport=transport) as client:
        run = waiting.wait_for_run(
            client,
            "echo",
            {"a": 1},
            "cli-key",
            on_update=lambda run: updates.append(run.status.value),
            pause=pauses.append,
        )
    assert (run.status.value, run.result) == ("succeeded", {"a": 1})
    assert updates == ["queued", "succeeded"] and pauses == [1.0, 1.0]
    assert {(r.method, r.url.path, r.headers["idempotency-key"]) for r in transport.seen} == {
        ("POST", "/v1/runs", "cli-key")
    }
    assert "wait" not in transport.seen[0].url.params
    assert all(r.url.params.get("wait") for r in transport.seen[1:])


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UnavailableError("cannot reach the runyard API: ConnectError"), 6),
        (UnavailableError("proxy", status=503), 5),
        (NotFoundError("no run", status=404), 5),
        (ArtifactIntegrityError("another SHA-256"), 5),
        (InvalidResponseError("an event over 16 MiB"), 5),
    ],
)
def test_error_exit__unreachable_only_without_any_answer(error: RunyardError, code: int):
    assert cli_common.error_exit(error) == code


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--url", "http://api:1", "--api-key", "k", "ls"],
        ["ls", "--json", "--url", "http://api:1", "--api-key", "k"],
        ["--json", "ls", "--url", "http://api:1", "--api-key", "k"],
        ["--url", "http://api:1", "ls", "--api-key", "k", "--json"],
    ],
)
def test_cli_global_flags__work_before_or_after_the_subcommand(argv: list[str]):
    args = cli.build_parser().parse_args(argv)
    assert (args.json, args.url, args.api_key) == (True, "http://api:1", "k")


def test_cli_global_flags__default_when_given_nowhere():
    args = cli.build_parser().parse_args(["ls"])
    assert (args.json, args.url, args.api_key) == (False, None, None)


@pytest.mark.parametrize("argv", [["--json", "keys", "ls"], ["keys", "ls", "--json"]])
def test_cli_keys_ls_json__before_or_after(argv: list[str]):
    assert cli.build_parser().parse_args(argv).json is True
