"""The tool registry: strict keys, operator maxima, schema checks, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from runyard.platform.settings import Settings
from runyard.registry.tools import RegistryError, load_registry, parse_registry

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(database_url="unused")
BASE = {"image": "img", "command": ["true"]}


def test_shipped_registry__loads_and_ships_nothing_arbitrary():
    registry = load_registry(ROOT / "tools" / "tools.toml", SETTINGS)
    assert set(registry.names()) == {"echo", "sleep", "fail", "wordcount", "report", "numstats"}
    echo = registry.get("echo")
    assert echo is not None and echo.image == "runyard/toolbox:latest"
    # Every shipped tool takes a closed input: no tool runs what a caller sends.
    for name in registry.names():
        tool = registry.get(name)
        assert tool is not None and "script" not in str(tool.input_schema)


def test_test_registry__is_the_shipped_one_plus_test_tools():
    shipped = load_registry(ROOT / "tools" / "tools.toml", SETTINGS)
    tests = load_registry(ROOT / "tests" / "tools.toml", SETTINGS)
    assert set(tests.names()) == {
        "echo",
        "sleep",
        "fail",
        "shell",
        "hostile",
        "result-bytes",
        "sandbox",
        "traceparent",
    }
    for name in ("echo", "sleep", "fail"):
        assert tests.get(name) == shipped.get(name)


def test_hostile_tool_limits__have_defaults_and_bounds():
    tool = parse_registry({"tools": {"t": BASE}}, SETTINGS).get("t")
    assert tool is not None
    assert (tool.disk_mb, tool.idle_timeout_seconds, tool.result_max_depth) == (1024, None, 64)
    for key, value in (("result_max_depth", 129), ("disk_mb", 0), ("idle_timeout_seconds", 1)):
        with pytest.raises(RegistryError, match=key):
            parse_registry({"tools": {"t": {**BASE, key: value}}}, SETTINGS)
    with pytest.raises(RegistryError, match="disk_mb 20000 > 10240"):
        parse_registry({"tools": {"t": {**BASE, "disk_mb": 20000}}}, SETTINGS)


def test_unknown_key__is_an_error_naming_tool_and_key():
    with pytest.raises(RegistryError, match=r"tools\.x\.privileged"):
        parse_registry({"tools": {"x": {**BASE, "privileged": True}}}, SETTINGS)


def test_unknown_top_level_key__is_an_error():
    with pytest.raises(RegistryError, match="unknown top-level"):
        parse_registry({"tool": {}}, SETTINGS)


def test_limits_above_operator_maxima__are_rejected():
    settings = Settings(database_url="unused", max_memory_mb=256, max_timeout_seconds=60)
    with pytest.raises(RegistryError) as info:
        parse_registry(
            {"tools": {"big": {**BASE, "memory_mb": 512, "timeout_seconds": 61}}}, settings
        )
    assert "memory_mb 512 > 256" in str(info.value)
    assert "timeout_seconds 61 > 60" in str(info.value)


def test_root_user__is_rejected():
    with pytest.raises(RegistryError, match="root"):
        parse_registry({"tools": {"r": {**BASE, "user": "0:0"}}}, SETTINGS)


@pytest.mark.parametrize("user", ["root", "nobody", "1000:staff", "-1", "1000:"])
def test_named_or_malformed_user__is_rejected(user: str):
    with pytest.raises(RegistryError, match="numeric uid"):
        parse_registry({"tools": {"r": {**BASE, "user": user}}}, SETTINGS)


@pytest.mark.parametrize("user", ["1000", "1000:1000", "65534:65534", "2147483647"])
def test_numeric_user__is_accepted(user: str):
    assert parse_registry({"tools": {"r": {**BASE, "user": user}}}, SETTINGS)


@pytest.mark.parametrize("user", ["2147483648", "1000:9999999999"])
def test_user_past_the_kernels_range__is_rejected(user: str):
    with pytest.raises(RegistryError, match="uid and gid must be at most 2147483647"):
        parse_registry({"tools": {"r": {**BASE, "user": user}}}, SETTINGS)


def test_invalid_input_schema__is_rejected():
    with pytest.raises(RegistryError, match="input_schema"):
        parse_registry({"tools": {"s": {**BASE, "input_schema": {"type": 12}}}}, SETTINGS)


def test_wrong_types__are_rejected_not_coerced():
    with pytest.raises(RegistryError, match="timeout_seconds"):
        parse_registry({"tools": {"t": {**BASE, "timeout_seconds": "30"}}}, SETTINGS)


def test_missing_file__says_where(tmp_path: Path):
    with pytest.raises(RegistryError, match="not found"):
        load_registry(tmp_path / "nope.toml", SETTINGS)


def test_bad_toml__says_so(tmp_path: Path):
    path = tmp_path / "tools.toml"
    path.write_text("[tools.x\n")
    with pytest.raises(RegistryError, match="not valid TOML"):
        load_registry(path, SETTINGS)


def test_snapshot__is_plain_json():
    registry = parse_registry({"tools": {"a": {**BASE, "cpus": 1}}}, SETTINGS)
    tool = registry.get("a")
    assert tool is not None
    snap = tool.snapshot()
    assert snap["name"] == "a" and snap["cpus"] == 1 and snap["user"] == "65534:65534"


def test_isolation_keys__default_to_no_network_and_the_engines_runtime():
    tool = parse_registry({"tools": {"t": BASE}}, SETTINGS).get("t")
    assert tool is not None
    assert (tool.network, tool.runtime, tool.secrets) == ("none", None, {})
    assert tool.snapshot()["network"] == "none"


@pytest.mark.parametrize("network", ["none", "bridge", "egress", "tools_net.1", "a-b"])
def test_network__none_bridge_or_a_docker_name_is_accepted(network: str):
    tool = parse_registry({"tools": {"t": {**BASE, "network": network}}}, SETTINGS).get("t")
    assert tool is not None and tool.network == network


@pytest.mark.parametrize(
    "network", ["host", "default", "container:abc", "", "x", "-net", "a b", "n" * 129, "ünet"]
)
def test_network__anything_else_is_refused_at_load(network: str):
    with pytest.raises(RegistryError, match=r"tools\.t: network .* must be 'none', 'bridge'"):
        parse_registry({"tools": {"t": {**BASE, "network": network}}}, SETTINGS)


def test_runtime__a_name_is_accepted_and_a_malformed_one_refused():
    tool = parse_registry({"tools": {"t": {**BASE, "runtime": "runsc"}}}, SETTINGS).get("t")
    assert tool is not None and tool.runtime == "runsc"
    with pytest.raises(RegistryError, match="runtime '--privileged' is not a runtime name"):
        parse_registry({"tools": {"t": {**BASE, "runtime": "--privileged"}}}, SETTINGS)
    with pytest.raises(RegistryError, match=r"tools\.t\.runtime"):
        parse_registry({"tools": {"t": {**BASE, "runtime": 1}}}, SETTINGS)


def test_secrets__references_are_checked_at_load():
    good = {"TOKEN": "env:TOOL_TOKEN", "CERT": "file:/run/secrets/cert"}
    tool = parse_registry({"tools": {"t": {**BASE, "secrets": good}}}, SETTINGS).get("t")
    assert tool is not None and tool.snapshot()["secrets"] == good
    cases = {
        "TOKEN": ("plain-value", "must be 'env:VAR' or 'file:/path'"),
        "1BAD": ("env:X", "not an environment variable name"),
        "RUNYARD_X": ("env:X", "prefix is the platform's"),
        "REL": ("file:relative/path", "absolute path"),
        "VAR": ("env:not a var", "not an environment variable name"),
    }
    for name, (reference, message) in cases.items():
        with pytest.raises(RegistryError, match=message):
            parse_registry({"tools": {"t": {**BASE, "secrets": {name: reference}}}}, SETTINGS)
    both = {**BASE, "env": {"TOKEN": "x"}, "secrets": {"TOKEN": "env:T"}}
    with pytest.raises(RegistryError, match="TOKEN is both in env and in secrets"):
        parse_registry({"tools": {"t": both}}, SETTINGS)


def test_snapshot__a_new_dict_each_time_and_a_copy_snapshots_its_own_fields():
    from runyard.registry.tools import ToolSpec

    tool = ToolSpec.model_validate({"name": "noop", "image": "a", "command": ["true"]})
    first, second = tool.snapshot(), tool.snapshot()
    assert first == second == tool.model_dump(mode="json") and first is not second
    first["image"] = "changed"
    assert tool.snapshot()["image"] == "a"
    assert tool.model_copy(update={"image": "b"}).snapshot()["image"] == "b"


def test_egress__bad_rules_and_a_network_beside_it_are_refused():
    document = {
        "tools": {
            "t": {
                "image": "img",
                "command": ["true"],
                "egress": ["api.example.org:443", "nohost"],
                "network": "bridge",
            }
        }
    }
    with pytest.raises(RegistryError) as raised:
        parse_registry(document, Settings(database_url="unused"))
    message = str(raised.value)
    assert "egress 'nohost' must be host:port" in message
    assert "network 'bridge' and egress together" in message
