"""The tool registry: a TOML file written by operators, validated strictly at load time."""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import jsonschema
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from runyard.domain.egress import egress_problems
from runyard.domain.flow_limits import FlowConfig, Limit, ToolFlow
from runyard.domain.limit_bounds import BOUNDS
from runyard.domain.tool_json import DEFAULT_MAX_DEPTH, MAX_STORED_DEPTH
from runyard.platform.settings import Settings
from runyard.registry.secrets import reference_problem

if TYPE_CHECKING:
    from runyard.domain.build_ref import BuildRef

_NUMERIC_USER = re.compile(r"[0-9]{1,10}(:[0-9]{1,10})?")
MAX_ID = 2_147_483_647
# Docker's rule for the names of containers, volumes and networks.
DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{1,127}")
RUNTIME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")
NO_NETWORK = "none"
BRIDGE_NETWORK = "bridge"
# Network modes that are not a network of their own: the host's stack, the engine's alias for
# the bridge, or another container's namespace.
_REFUSED_NETWORKS = frozenset({"host", "default"})

TOOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,63}$"


class RegistryError(Exception):
    """The tool registry file is missing, unreadable or invalid."""


def within_bounds(name: str) -> AfterValidator:
    """Pydantic metadata: the value stays within the bounds of limit ``name``
    (``runyard.domain.limit_bounds``), or fails with a message that names them."""
    bound = BOUNDS[name]

    def check(value: float) -> float:
        problem = bound.problem(value)
        if problem is not None:
            raise PydanticCustomError(
                "limit_out_of_bounds",
                "{problem}, not {value}",
                {"problem": problem, "value": value},
            )
        return value

    return AfterValidator(check)


def bounds_schema(name: str) -> dict[str, Any]:
    """The JSON schema keywords of limit ``name``'s bounds (the OpenAPI document shows them)."""
    bound = BOUNDS[name]
    return {"minimum": bound.floor, "maximum": bound.ceiling}


def _limit(name: str, default: float | None) -> Any:
    """A limit field: its default, and its bounds in the JSON schema."""
    return Field(default=default, json_schema_extra=bounds_schema(name))


_Seconds = Annotated[StrictInt, within_bounds("timeout_seconds")]
_MemoryMb = Annotated[StrictInt, within_bounds("memory_mb")]
_Cpus = Annotated[StrictFloat | StrictInt, within_bounds("cpus")]


class BuildSpec(BaseModel):
    """How the platform builds a tool's image from source (``build = { ... }``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # A directory relative to the tools file; the Dockerfile is a path inside it.
    context: str = Field(min_length=1)
    dockerfile: str = Field(default="Dockerfile", min_length=1)
    args: dict[str, str] = Field(default_factory=dict)
    # The build's network: none unless a step must fetch something.
    network: Literal["none", "bridge"] = "none"


class FlowSpec(BaseModel):
    """A tool's flow limits (``[tools.<name>.flow]``): for all its runs, and for each
    concurrency key of a tenant (a run's ``concurrency_key``). Unset: no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_running: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    starts_per_second: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=100_000)
    key_max_running: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    key_starts_per_second: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=100_000)

    def limits(self) -> ToolFlow:
        """The limits as the flow rules read them."""
        return ToolFlow(
            tool=Limit(self.max_running, _rate(self.starts_per_second)),
            key=Limit(self.key_max_running, _rate(self.key_starts_per_second)),
        )


def _rate(value: float | None) -> float | None:
    return None if value is None else float(value)


class ToolSpec(BaseModel):
    """One tool as the registry defines it; snapshotted into every run at submit time."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    image: str | None = Field(default=None, min_length=1)
    build: BuildSpec | None = None
    build_timeout_seconds: StrictInt = Field(default=600, ge=1, le=86_400)
    command: list[str] = Field(min_length=1)
    entrypoint: list[str] | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict)
    network: str = NO_NETWORK
    # Destinations reachable through the platform's filtering proxy (runyard.domain.egress):
    # the tool gets a network of its own with that one way out.
    egress: list[str] | None = None
    runtime: str | None = None
    user: str = "65534:65534"
    # Every limit stays within runyard.domain.limit_bounds, whatever the operator maxima say.
    timeout_seconds: _Seconds = _limit("timeout_seconds", 30)
    memory_mb: _MemoryMb = _limit("memory_mb", 128)
    cpus: _Cpus = _limit("cpus", 0.5)
    pids_limit: Annotated[StrictInt, within_bounds("pids_limit")] = _limit("pids_limit", 64)
    tmpfs_mb: Annotated[StrictInt, within_bounds("tmpfs_mb")] = _limit("tmpfs_mb", 16)
    nofile_limit: Annotated[StrictInt, within_bounds("nofile_limit")] = _limit("nofile_limit", 1024)
    max_attempts: StrictInt = Field(default=1, ge=1, le=20)
    queue: str = Field(default="default", pattern=QUEUE_NAME_PATTERN)
    # How far a run may raise its own limits (None: the tool's own value, no raise).
    max_timeout_seconds: _Seconds | None = _limit("timeout_seconds", None)
    max_memory_mb: _MemoryMb | None = _limit("memory_mb", None)
    max_cpus: _Cpus | None = _limit("cpus", None)
    stdout_cap_bytes: Annotated[StrictInt, within_bounds("stdout_cap_bytes")] | None = _limit(
        "stdout_cap_bytes", None
    )
    result_cap_bytes: Annotated[StrictInt, within_bounds("result_cap_bytes")] | None = _limit(
        "result_cap_bytes", None
    )
    result_max_depth: StrictInt = Field(default=DEFAULT_MAX_DEPTH, ge=1, le=MAX_STORED_DEPTH)
    disk_mb: Annotated[StrictInt, within_bounds("disk_mb")] = _limit("disk_mb", 1024)
    # The most the files left under /runyard/out may hold in all (runyard.artifacts.rules).
    artifacts_max_mb: Annotated[StrictInt, within_bounds("artifacts_max_mb")] = _limit(
        "artifacts_max_mb", 100
    )
    idle_timeout_seconds: Annotated[StrictInt, within_bounds("idle_timeout_seconds")] | None = (
        _limit("idle_timeout_seconds", None)
    )
    input_schema: dict[str, Any] | None = None
    flow: FlowSpec | None = None
    # Whether callers may hold its containers as sandboxes (POST /v1/sandboxes, docs/sandboxes.md).
    sandbox: bool = False

    def snapshot(self) -> dict[str, Any]:
        """The JSON stored on a run: later registry edits never change queued runs. A new
        dict each call; its nested values are shared between calls (read them only)."""
        return dict(self._snapshot)

    @functools.cached_property
    def _snapshot(self) -> dict[str, Any]:
        # The model is frozen: dumped once, not once per run of a 1,000-run batch.
        return self.model_dump(mode="json")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy, without the snapshot cached for this one (``update`` changes fields)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("_snapshot", None)
        return copy

    def limit_maxima(self) -> dict[str, float]:
        """The most a run may ask for, per limit: the tool's maximum, else its own value."""
        return {
            "timeout_seconds": self.max_timeout_seconds or self.timeout_seconds,
            "memory_mb": self.max_memory_mb or self.memory_mb,
            "cpus": self.max_cpus or self.cpus,
        }


class BuildResolver:
    """Resolves a built tool to the content-addressed build of its current source."""

    def resolve(self, tool: ToolSpec) -> BuildRef:  # pragma: no cover - interface
        """The build the tool's source names now (its context kept for the builders)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ToolRegistry:
    """The loaded registry, keyed by tool name."""

    tools: Mapping[str, ToolSpec]
    # The tools file's directory: build contexts are relative to it.
    base_dir: Path | None = None
    # Set by the API: where submits learn a built tool's digest (None: built tools refused).
    builds: BuildResolver | None = None
    # The file it was read from, and how often a running process re-reads it (None: never).
    source: Path | None = None
    reload_seconds: float | None = None
    # Each tenant's flow limits (the operator's settings, not the file): runs of every tool
    # are under them.
    tenant_flow: Limit = field(default_factory=Limit)

    def get(self, name: str) -> ToolSpec | None:
        """The tool called ``name``, or None."""
        return self.tools.get(name)

    def flow_config(self, only: ToolSpec | None = None) -> FlowConfig:
        """The flow limits as they are now: of every tool (or ``only`` that one), and each
        tenant's."""
        tools = [only] if only is not None else list(self.tools.values())
        flows = {tool.name: tool.flow.limits() for tool in tools if tool.flow is not None}
        return FlowConfig(tools=flows, tenant=self.tenant_flow)

    def names(self) -> list[str]:
        """Tool names in sorted order."""
        return sorted(self.tools)

    def unknown_tool_message(self, name: str) -> str:
        """What a caller is told about a tool this registry lacks: where tools come from and
        when an edit of that file is seen."""
        message = f"no tool named {name!r}; GET /v1/tools lists them"
        if self.source is None:
            return message
        message += f". Tools come from the registry file {self.source} (RUNYARD_TOOLS_FILE)"
        if self.reload_seconds is None:
            return message + ", read when the process starts: restart it after an edit"
        return message + f"; an edit is picked up within {self.reload_seconds:g} s"


def _check_against_maxima(tool: ToolSpec, settings: Settings) -> list[str]:
    problems = []
    if tool.timeout_seconds > settings.max_timeout_seconds:
        problems.append(f"timeout_seconds {tool.timeout_seconds} > {settings.max_timeout_seconds}")
    if tool.memory_mb > settings.max_memory_mb:
        problems.append(f"memory_mb {tool.memory_mb} > {settings.max_memory_mb}")
    if tool.cpus > settings.max_cpus:
        problems.append(f"cpus {tool.cpus} > {settings.max_cpus}")
    if tool.disk_mb > settings.max_disk_mb:
        problems.append(f"disk_mb {tool.disk_mb} > {settings.max_disk_mb}")
    for limit, most in tool.limit_maxima().items():
        if getattr(tool, f"max_{limit}") is None:
            continue
        if most < getattr(tool, limit):
            problems.append(f"max_{limit} {most} < {limit} {getattr(tool, limit)}")
        if most > getattr(settings, f"max_{limit}"):
            problems.append(f"max_{limit} {most} > {getattr(settings, f'max_{limit}')}")
    if tool.artifacts_max_mb > settings.max_artifacts_mb:
        problems.append(f"artifacts_max_mb {tool.artifacts_max_mb} > {settings.max_artifacts_mb}")
    if tool.pids_limit > settings.max_pids:
        problems.append(f"pids_limit {tool.pids_limit} > {settings.max_pids}")
    if not _NUMERIC_USER.fullmatch(tool.user):
        # Numeric: the engine must not resolve names inside the image, and out/ is chowned.
        problems.append(f"user {tool.user!r} must be a numeric uid or uid:gid")
    elif tool.user.split(":")[0] == "0":
        problems.append("user must not be root")
    elif any(int(part) > MAX_ID for part in tool.user.split(":")):
        # The kernel's range: the engine would refuse to start every run of the tool.
        problems.append(f"user {tool.user!r}: uid and gid must be at most {MAX_ID}")
    problems.extend(isolation_problems(tool))
    problems.extend(build_problems(tool))
    if tool.input_schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        except jsonschema.SchemaError as exc:
            problems.append(f"input_schema is not a valid JSON Schema: {exc.message}")
    return problems


def isolation_problems(tool: ToolSpec) -> list[str]:
    """What is wrong with the tool's network, runtime and secrets (the engine is asked about
    the network and runtime later, at worker start)."""
    problems = []
    network = tool.network
    if network in _REFUSED_NETWORKS or not DOCKER_NAME.fullmatch(network):
        problems.append(
            f"network {network!r} must be 'none', 'bridge' or the name of a Docker network"
        )
    if tool.egress is not None:
        problems.extend(egress_problems(tool.egress))
        if network != NO_NETWORK:
            problems.append(
                f"network {network!r} and egress together: egress gives the tool a network "
                "of its own, leave network unset"
            )
    if tool.runtime is not None and not RUNTIME_NAME.fullmatch(tool.runtime):
        problems.append(f"runtime {tool.runtime!r} is not a runtime name")
    for name, reference in tool.secrets.items():
        problem = reference_problem(name, reference)
        if problem is not None:
            problems.append(problem)
        elif name in tool.env:
            problems.append(f"{name} is both in env and in secrets")
    return problems


def build_problems(tool: ToolSpec) -> list[str]:
    """What is wrong with how the tool names its image: exactly one of image and build, a
    relative context and a Dockerfile inside it."""
    if (tool.image is None) == (tool.build is None):
        return ["exactly one of image and build must be given"]
    if tool.build is None:
        return []
    problems = []
    if PurePosixPath(tool.build.context).is_absolute():
        problems.append(f"build.context {tool.build.context!r} must be relative to the tools file")
    dockerfile = PurePosixPath(tool.build.dockerfile)
    if dockerfile.is_absolute() or ".." in dockerfile.parts:
        problems.append(f"build.dockerfile {tool.build.dockerfile!r} must be inside the context")
    return problems


def parse_registry(
    document: Mapping[str, Any], settings: Settings, base_dir: Path | None = None
) -> ToolRegistry:
    """Validate a parsed TOML document; every problem is reported with its tool and key."""
    unknown = set(document) - {"tools"}
    if unknown:
        raise RegistryError(f"unknown top-level keys: {', '.join(sorted(unknown))}")
    raw_tools = document.get("tools", {})
    if not isinstance(raw_tools, Mapping):
        raise RegistryError("[tools] must be a table of tool tables")
    tools: dict[str, ToolSpec] = {}
    errors: list[str] = []
    for name, entry in raw_tools.items():
        if not isinstance(entry, Mapping):
            errors.append(f"tools.{name}: must be a table")
            continue
        try:
            tool = ToolSpec.model_validate({"name": name, **entry})
        except ValidationError as exc:
            for err in exc.errors():
                where = ".".join(str(part) for part in err["loc"])
                errors.append(f"tools.{name}.{where}: {err['msg']}")
            continue
        errors.extend(f"tools.{name}: {p}" for p in _check_against_maxima(tool, settings))
        tools[name] = tool
    if errors:
        raise RegistryError("invalid tool registry:\n  " + "\n  ".join(errors))
    return ToolRegistry(tools=tools, base_dir=base_dir)


def load_registry(path: Path, settings: Settings) -> ToolRegistry:
    """Read and validate the registry file at ``path``."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RegistryError(f"tool registry not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"tool registry {path} is not valid TOML: {exc}") from exc
    return dataclasses.replace(
        parse_registry(document, settings, path.resolve().parent),
        source=path,
        tenant_flow=settings.tenant_flow_limit(),
    )
