"""The pure rules of webhooks: which URLs and addresses are allowed, the backoff, the
signature and the body (no I/O: resolvers are tables)."""

from __future__ import annotations

import ipaddress
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from api.routes.runs import RUN_JSON
from api.schemas import RunOut
from runyard.models import RunStatus
from runyard.runs import RunView
from runyard.settings import Settings
from runyard.tenant_webhooks import new_secret
from runyard.webhook_urls import (
    MAX_URL_LENGTH,
    BadCallbackUrl,
    DestinationRefused,
    checked_addresses,
    parse_callback_url,
    refusal,
)
from runyard.webhooks import retry_delay, run_json, signed_headers


@pytest.mark.parametrize(
    ("url", "host", "port", "netloc", "target"),
    [
        ("http://hooks.example/", "hooks.example", 80, "hooks.example", "/"),
        ("https://hooks.example", "hooks.example", 443, "hooks.example", "/"),
        ("HTTPS://Hooks.Example:8443/a/b?x=1&y=2", "hooks.example", 8443, "Hooks.Example:8443",
         "/a/b?x=1&y=2"),
        ("http://127.0.0.1:9000/hook#frag", "127.0.0.1", 9000, "127.0.0.1:9000", "/hook"),
        ("http://[::1]:9000/h", "::1", 9000, "[::1]:9000", "/h"),
    ],
)  # fmt: skip
def test_parse_callback_url__accepts(url: str, host: str, port: int, netloc: str, target: str):
    parsed = parse_callback_url(url)
    assert (parsed.host, parsed.port, parsed.netloc, parsed.target) == (host, port, netloc, target)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://hooks.example/", "http:// or https://"),
        ("hooks.example/path", "http:// or https://"),
        ("http:///path", "no host"),
        ("http://user:pw@hooks.example/", "credentials"),
        ("http://hooks.example/a b", "whitespace"),
        ("http://hooks.example/\x00", "control"),
        ("http://hooks.example:0/", "port"),
        ("http://hooks.example:99999/", "malformed"),
        ("http://[::1/", "malformed"),
        ("http://hooks.example/" + "a" * MAX_URL_LENGTH, "longer than"),
    ],
)
def test_parse_callback_url__refuses(url: str, message: str):
    with pytest.raises(BadCallbackUrl, match=message):
        parse_callback_url(url)


@pytest.mark.parametrize(
    ("address", "allow_private", "refused"),
    [
        ("93.184.215.14", False, None),
        ("2606:4700::6810:84e5", False, None),
        ("127.0.0.1", False, "loopback"),
        ("127.0.0.1", True, None),
        ("::1", False, "loopback"),
        ("10.1.2.3", False, "private"),
        ("192.168.0.10", False, "private"),
        ("172.16.0.1", False, "private"),
        ("169.254.169.254", False, "link-local"),
        ("fe80::1", False, "link-local"),
        ("fd00::1", False, "private"),
        ("::ffff:127.0.0.1", False, "loopback"),
        ("::ffff:10.0.0.1", True, None),
        ("100.64.0.1", False, "non-public"),
        ("0.0.0.0", True, "unspecified"),
        ("::", True, "unspecified"),
        ("224.0.0.1", True, "multicast"),
    ],
)
def test_refusal__table(address: str, allow_private: bool, refused: str | None):
    reason = refusal(ipaddress.ip_address(address), allow_private=allow_private)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def resolver(*addresses: str) -> Any:
    def resolve(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    return resolve


def test_checked_addresses__every_address_is_checked():
    with pytest.raises(DestinationRefused, match=r"10\.0\.0\.5 is a private"):
        checked_addresses(
            "hooks.example", 443, allow_private=False, resolve=resolver("93.184.215.14", "10.0.0.5")
        )


def test_checked_addresses__duplicates_once_and_scope_ids_dropped():
    found = checked_addresses(
        "hooks.example", 443, allow_private=True, resolve=resolver("fe80::1%eth0", "fe80::1")
    )
    assert found == [ipaddress.ip_address("fe80::1")]


def test_checked_addresses__a_name_that_does_not_resolve_is_refused():
    def fails(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(DestinationRefused, match="cannot resolve"):
        checked_addresses("nowhere.invalid", 80, allow_private=False, resolve=fails)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 5.0), (2, 10.0), (3, 20.0), (8, 640.0), (11, 3600.0), (500, 3600.0), (0, 5.0)],
)
def test_retry_delay__doubles_up_to_the_cap(attempt: int, expected: float):
    assert retry_delay(attempt, base_seconds=5, max_seconds=3600) == expected


def test_signed_headers__verify_with_the_library_and_only_for_that_body():
    secret = new_secret()
    body = b'{"id":"x","status":"succeeded"}'
    headers = signed_headers(secret, "msg-1", body, datetime.now(UTC))
    assert headers["webhook-id"] == "msg-1"
    assert Webhook(secret).verify(body, headers) == {"id": "x", "status": "succeeded"}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"id":"x","status":"failed"}', headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


def test_signed_headers__an_old_timestamp_is_refused_by_receivers():
    secret = new_secret()
    headers = signed_headers(secret, "m", b"{}", datetime.now(UTC) - timedelta(minutes=10))
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(b"{}", headers)


def test_run_json__is_what_the_api_serializes():
    stamp = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    view = RunView(
        id=uuid.uuid4(),
        tool="echo",
        status=RunStatus.SUCCEEDED,
        mode="queue",
        input={"message": "héllo", "n": [1, 2.5, None]},
        result={"ok": True},
        exit_code=0,
        attempts=1,
        max_attempts=1,
        error_code=None,
        error=None,
        stdout_truncated=False,
        stderr_truncated=True,
        requested_at=stamp,
        started_at=stamp,
        finished_at=stamp,
    )
    assert run_json(view) == RUN_JSON.dump_json(view)  # what POST /v1/runs answers
    assert run_json(view) == TypeAdapter(RunOut).dump_json(RunOut.of(view))  # GET's model


def test_settings__webhook_lease_must_outlast_the_timeout():
    with pytest.raises(ValueError, match="WEBHOOK_LEASE_SECONDS"):
        Settings(database_url="x", webhook_timeout_seconds=10, webhook_lease_seconds=10)
    assert Settings(database_url="x", retention_days=0).retention_days == 0


def test_docs_receiver_example__verifies_deliveries_and_drops_duplicates(
    capsys: pytest.CaptureFixture[str],
):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    example = docs.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(example, "docs/api.md", "exec"), namespace)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"id":"r1","status":"succeeded","result":{"ok":true}}'
    headers = signed_headers(secret, "delivery-1", body, datetime.now(UTC))
    handle = namespace["handle"]
    assert handle(body, headers) == 204
    assert handle(body, headers) == 204
    assert handle(body.replace(b"succeeded", b"failed"), headers) == 401
    assert capsys.readouterr().out == "r1 succeeded {'ok': True}\n"
