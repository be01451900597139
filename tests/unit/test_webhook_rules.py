"""The pure rules of webhooks: which URLs and addresses are allowed, the backoff, the
signature and the body (no I/O: resolvers are tables)."""

from __future__ import annotations

import ipaddress
import re
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
from runyard.domain.states import RunStatus
from runyard.domain.webhook_fairness import BreakerPolicy, Caps
from runyard.platform.settings import Settings
from runyard.reads.run_view import RunView
from runyard.webhooks.delivery import WebhookConfig, retry_delay, run_json, signed_headers
from runyard.webhooks.tenant import new_secret
from runyard.webhooks.urls import (
    MAX_URL_LENGTH,
    STRICT,
    BadCallbackUrl,
    DestinationPolicy,
    DestinationRefused,
    check_destination,
    checked_addresses,
    destination_key,
    parse_callback_url,
    refusal,
)


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


PRIVATE = DestinationPolicy(allow_private=True)
LOOPBACK = DestinationPolicy(allow_loopback=True)
BOTH = DestinationPolicy(allow_private=True, allow_loopback=True)


@pytest.mark.parametrize(
    ("address", "policy", "refused"),
    [
        ("93.184.215.14", STRICT, None),
        ("2606:4700::6810:84e5", STRICT, None),
        # loopback: only its own switch opens it
        ("127.0.0.1", STRICT, "loopback"),
        ("127.0.0.1", PRIVATE, "ALLOW_LOOPBACK"),
        ("127.0.0.1", LOOPBACK, None),
        ("::1", PRIVATE, "loopback"),
        ("::1", LOOPBACK, None),
        # private ranges: RFC 1918, carrier-grade NAT, unique local, site-local
        ("10.1.2.3", STRICT, "private"),
        ("10.1.2.3", LOOPBACK, "ALLOW_PRIVATE"),
        ("10.1.2.3", PRIVATE, None),
        ("192.168.0.10", STRICT, "private"),
        ("172.16.0.1", STRICT, "private"),
        ("100.64.0.1", STRICT, "private"),
        ("100.64.0.1", PRIVATE, None),
        ("fd00::1", STRICT, "private"),
        ("fd00::1", PRIVATE, None),
        ("fec0::1", STRICT, "private"),
        ("fec0::1", PRIVATE, None),
        # link-local and metadata: never, whatever is allowed
        ("169.254.169.254", BOTH, "link-local or cloud metadata"),
        ("169.254.0.1", BOTH, "link-local"),
        ("fe80::1", BOTH, "link-local"),
        ("100.100.100.200", BOTH, "cloud metadata"),
        ("fd00:ec2::254", BOTH, "cloud metadata"),
        # IPv4-mapped
        ("::ffff:127.0.0.1", STRICT, "embeds 127.0.0.1 is a loopback"),
        ("::ffff:10.0.0.1", PRIVATE, None),
        ("::ffff:169.254.169.254", BOTH, "link-local"),
        ("::ffff:93.184.215.14", STRICT, None),
        # IPv4-translated (SIIT, ::ffff:0:0:0/96): judged by the IPv4 address it carries
        ("::ffff:0:7f00:1", STRICT, "embeds 127.0.0.1 is a loopback"),
        ("::ffff:0:a9fe:a9fe", BOTH, "embeds 169.254.169.254"),
        ("::ffff:0:a00:1", STRICT, "embeds 10.0.0.1 is a private"),
        ("::ffff:0:a00:1", PRIVATE, None),
        ("::ffff:0:5db8:d70e", STRICT, None),
        # NAT64 (well-known prefix): judged by the IPv4 address it carries
        ("64:ff9b::7f00:1", STRICT, "embeds 127.0.0.1 is a loopback"),
        ("64:ff9b::a9fe:a9fe", BOTH, "embeds 169.254.169.254"),
        ("64:ff9b::a00:1", STRICT, "embeds 10.0.0.1 is a private"),
        ("64:ff9b::5db8:d70e", STRICT, None),
        # local-use NAT64: refused as a range
        ("64:ff9b:1::a00:1", BOTH, "local-use NAT64"),
        ("64:ff9b:1:2::5db8:d70e", BOTH, "local-use NAT64"),
        # IPv4-compatible
        ("::127.0.0.1", STRICT, "embeds 127.0.0.1 is a loopback"),
        ("::10.0.0.1", STRICT, "embeds 10.0.0.1"),
        ("::169.254.169.254", BOTH, "link-local"),
        ("::93.184.215.14", STRICT, None),
        # 6to4: the IPv4 address in bits 16-48
        ("2002:7f00:1::1", STRICT, "embeds 127.0.0.1 is a loopback"),
        ("2002:a9fe:a9fe::", BOTH, "embeds 169.254.169.254"),
        ("2002:a00:1::1", STRICT, "embeds 10.0.0.1 is a private"),
        ("2002:5db8:d70e::1", STRICT, None),
        # Teredo: refused as a range
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", BOTH, "Teredo"),
        # never: unspecified, multicast, reserved, documentation
        ("0.0.0.0", BOTH, "unspecified"),
        ("::", BOTH, "unspecified"),
        ("224.0.0.1", BOTH, "multicast"),
        ("ff02::1", BOTH, "multicast"),
        ("240.0.0.1", BOTH, "reserved"),
        ("192.0.2.1", BOTH, "reserved"),
        ("2001:db8::1", BOTH, "reserved"),
    ],
)
def test_refusal__table(address: str, policy: DestinationPolicy, refused: str | None):
    reason = refusal(ipaddress.ip_address(address), policy)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason, reason


def resolver(*addresses: str) -> Any:
    def resolve(host: str, port: int, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    return resolve


def never_resolve(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("name resolution must not happen here")


def test_checked_addresses__every_address_is_checked_and_none_is_told():
    with pytest.raises(DestinationRefused) as refused:
        checked_addresses("hooks.example", 443, STRICT, resolver("93.184.215.14", "10.0.0.5"))
    assert str(refused.value) == "hooks.example resolves to a non-public address"
    assert refused.value.address == "10.0.0.5"  # for operators' logs only


def test_checked_addresses__duplicates_once_and_scope_ids_dropped():
    found = checked_addresses("hooks.example", 443, PRIVATE, resolver("fd00::1%eth0", "fd00::1"))
    assert found == [ipaddress.ip_address("fd00::1")]


def test_checked_addresses__a_literal_address_is_judged_without_resolving():
    assert checked_addresses("93.184.215.14", 80, STRICT, never_resolve) == [
        ipaddress.ip_address("93.184.215.14")
    ]
    with pytest.raises(DestinationRefused, match=r"^127\.0\.0\.1 is a loopback"):
        checked_addresses("127.0.0.1", 80, STRICT, never_resolve)


def test_checked_addresses__a_name_that_does_not_resolve_is_refused():
    def fails(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(DestinationRefused, match="cannot resolve"):
        checked_addresses("nowhere.invalid", 80, STRICT, fails)


@pytest.mark.parametrize(
    ("url", "policy", "refused"),
    [
        ("https://hooks.example/x", STRICT, None),  # a name: judged at delivery, not here
        ("https://internal.corp/x", STRICT, None),
        ("http://93.184.215.14/x", STRICT, None),
        ("http://127.0.0.1:8080/x", STRICT, "127.0.0.1 is a loopback address"),
        ("http://127.0.0.1:8080/x", LOOPBACK, None),
        ("http://127.1/x", STRICT, "127.0.0.1 is a loopback"),
        ("http://0x7f.0.0.1/x", STRICT, "127.0.0.1 is a loopback"),
        ("http://2130706433/x", STRICT, "127.0.0.1 is a loopback"),
        ("http://localhost:8080/x", STRICT, "localhost is a loopback name"),
        ("http://api.localhost/x", STRICT, "loopback name"),
        ("http://localhost:8080/x", LOOPBACK, None),
        ("http://[::ffff:10.0.0.1]/x", STRICT, "10.0.0.1 is a private"),
        ("http://[64:ff9b::a9fe:a9fe]/x", BOTH, "169.254.169.254"),
        ("http://[::ffff:0:7f00:1]/x", STRICT, "127.0.0.1 is a loopback"),
        ("http://[2002:a00:1::1]/x", STRICT, "10.0.0.1 is a private"),
        ("http://169.254.169.254/latest", BOTH, "never allowed"),
    ],
)
def test_check_destination__judges_what_the_url_says_and_never_resolves(
    url: str, policy: DestinationPolicy, refused: str | None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(socket, "getaddrinfo", never_resolve)
    if refused is None:
        assert check_destination(url, policy).url == url
    else:
        with pytest.raises(DestinationRefused, match=re.escape(refused)):
            check_destination(url, policy)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://Hooks.Example/a", "hooks.example:443"),
        ("http://hooks.example/a", "hooks.example:80"),
        ("http://hooks.example:8080/a?b", "hooks.example:8080"),
        ("http://[2606:4700::1]:81/", "[2606:4700::1]:81"),
        ("ftp://x/", "invalid:ftp://x/"),
    ],
)
def test_destination_key__host_and_port(url: str, key: str):
    assert destination_key(url) == key


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


def test_settings__breaker_cool_down_max_is_not_below_its_start():
    with pytest.raises(ValueError, match="BREAKER_COOLDOWN_MAX_SECONDS"):
        Settings(
            database_url="x",
            webhook_breaker_cooldown_seconds=120,
            webhook_breaker_cooldown_max_seconds=60,
        )


def test_webhook_config__from_settings_carries_caps_breaker_and_policy():
    settings = Settings(
        database_url="x",
        webhook_tenant_concurrency=3,
        webhook_destination_concurrency=2,
        webhook_breaker_failures=7,
        webhook_breaker_cooldown_seconds=30,
        webhook_breaker_cooldown_max_seconds=300,
        webhook_resolver_threads=5,
        webhook_allow_loopback=True,
    )
    config = WebhookConfig.from_settings(settings)
    assert config.caps == Caps(per_tenant=3, per_destination=2)
    assert config.breaker == BreakerPolicy(7, 30, 300)
    assert config.resolver_threads == 5
    assert config.policy == DestinationPolicy(allow_private=False, allow_loopback=True)
    assert WebhookConfig.from_settings(Settings(database_url="x")).policy == STRICT


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
