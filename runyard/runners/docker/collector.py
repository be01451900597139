"""Collecting an exited attempt: its exit (an OOM kill told from the tool's own SIGKILL), its
capped logs, its usage, ``result.json`` and the files under ``out/`` as an artifact set."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import docker.errors
import urllib3.exceptions

from runyard.artifact_store import CHUNK_SIZE, ArtifactStore, ArtifactWriter
from runyard.artifacts.collect import CollectError, collect_dir, collect_tar
from runyard.artifacts.rules import ArtifactLimits, ArtifactRefused, is_result, with_artifacts
from runyard.domain.attempt import AttemptResult, AttemptSpec
from runyard.domain.outcomes import ExitFacts, StopReason, decide_exit, decide_result
from runyard.domain.states import ErrorCode
from runyard.domain.tool_json import DEFAULT_MAX_DEPTH
from runyard.domain.usage import Counters, usage_of
from runyard.registry.redact import Redactor
from runyard.runner import AttemptControl, RunnerUnavailable
from runyard.runners.docker.egress import EgressGate, wants_egress
from runyard.runners.docker.engine_calls import (
    GOING,
    TRANSPORT_ERRORS,
    fence,
    inspect_container,
    parse_docker_time,
)
from runyard.runners.docker.hardening import WORKDIR
from runyard.runners.docker.host_workdirs import AttemptDirs
from runyard.runners.docker.live_logs import AttemptLogs, timestamp_key
from runyard.runners.docker.outputs import (
    latest_entry_stamp,
    parse_result_archive,
    stat_is_link,
    stored_logs,
)
from runyard.runners.docker.usage_meter import UsageMeter
from runyard.runners.docker.watch import AttemptWatch

logger = logging.getLogger(__name__)

SIGKILL_EXIT = 137
# How long an unexplained SIGKILL exit waits for the engine's OOM record (seconds, in steps).
OOM_EVENT_WAITS = (0.1, 0.2, 0.3, 0.4)
# Entries read from the log's end for its latest stamp. Each stream's copier stamps an entry
# and then writes it, one at a time, so after the latest-stamped entry come at most one
# entry of the other stream, or the rest of a line longer than 16 KiB, which the engine
# writes in 16 KiB pieces that all carry its first piece's stamp: 64 entries cover a line of
# up to a mebibyte, and read at most that much.
LAST_ENTRIES = 64


class AttemptCollector:
    """Reads an exited attempt's outcome and outputs off the engine (or its host directory)."""

    def __init__(
        self,
        api: Any,
        dirs: AttemptDirs,
        egress: EgressGate,
        meter: UsageMeter,
        *,
        stdout_cap_bytes: int,
        result_cap_bytes: int,
    ) -> None:
        self._api = api
        self._dirs = dirs
        self._egress = egress
        self._meter = meter
        self._stdout_cap_bytes = stdout_cap_bytes
        self._result_cap_bytes = result_cap_bytes

    def collect(
        self,
        container_id: str,
        spec: AttemptSpec,
        control: AttemptControl,
        stopped_for: StopReason | None,
        live: AttemptLogs,
        watch: AttemptWatch,
        sampled: Counters,
    ) -> AttemptResult:
        """The exited attempt's outcome, with its outputs and (if kept) its artifact set."""
        attrs = self._exited_attrs(container_id, stopped_for)
        watch.inspected(attrs)
        if wants_egress(spec.tool):
            self._egress.report(spec.container_name, control.note)
        state = attrs["State"]
        exit_code = int(state.get("ExitCode", -1))
        finished_text = state.get("FinishedAt")
        finished_at = parse_docker_time(finished_text)
        image_digest = str(attrs.get("Image") or "") or None
        cap = int(spec.tool.get("stdout_cap_bytes") or self._stdout_cap_bytes)
        try:
            stdout, stderr = stored_logs(self._api, container_id, cap, live.redactor)
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read logs of {container_id}: {exc}") from exc
        if not live.started and finished_at is not None and (stdout.total or stderr.total):
            live.replay(stdout, stderr, self.replay_stamp(container_id, str(finished_text)))
        common: dict[str, Any] = {
            "exit_code": exit_code,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "stdout_truncated": stdout.truncated,
            "stderr_truncated": stderr.truncated,
            "image_digest": image_digest,
        }
        disk_used = watch.disk_used()
        common["usage"] = usage_of(
            self._meter.read(spec.container_name, sampled),
            started_at=parse_docker_time(state.get("StartedAt")),
            finished_at=finished_at,
            disk_bytes=disk_used,
        )
        facts = ExitFacts(
            exit_code=exit_code,
            oom_killed=bool(state.get("OOMKilled")),
            finished_at=finished_at,
            deadline_at=spec.deadline_at,
            stopped_for=stopped_for,
            cancel_requested=control.cancel.is_set(),
            # Only a failed exit can be explained by a fill (an adopter has no other proof).
            disk_used_bytes=disk_used if exit_code != 0 else None,
        )
        verdict = decide_exit(facts, watch.limits)
        if verdict.read_result:
            result_cap = int(spec.tool.get("result_cap_bytes") or self._result_cap_bytes)
            depth = int(spec.tool.get("result_max_depth") or DEFAULT_MAX_DEPTH)
            result, problem = self._read_result(container_id, spec, attrs, result_cap, depth)
            verdict = decide_result(problem)
            common["result"] = live.redactor.json(result) if problem is None else None
        error = None if verdict.error is None else live.redactor.text(verdict.error)
        outcome = AttemptResult(
            status=verdict.status, error_code=verdict.error_code, error=error, **common
        )
        if control.artifacts is None:
            return outcome
        labels = attrs.get("Config", {}).get("Labels") or {}
        host_dir = self._dirs.host_dir(spec.container_name, labels)
        if host_dir is None or _may_hold_artifacts(host_dir / "out"):
            # Files are about to be stored (or read through the engine) on this attempt's
            # behalf. With nothing under out/ no file is, and no engine call is made: at
            # most a store records the empty set, which only a fenced finalize can publish.
            fence(control, spec)
        return self._collect_artifacts(
            container_id, spec, host_dir, control.artifacts, outcome, live.redactor
        )

    def replay_stamp(self, container_id: str, finished_text: str) -> str:
        """The later of the exit time and the latest log line's engine timestamp: under load
        the engine stamps a line when it copies it, which can be after the exit."""
        last = self.last_log_stamp(container_id)
        if last is None:
            return finished_text
        return max(finished_text, last, key=timestamp_key)

    def last_log_stamp(self, container_id: str) -> str | None:
        """The latest engine timestamp of the container's log entries, if it has any.

        The log keeps the entries in the order they were written, not stamped: each stream
        is copied by a thread of its own that stamps an entry and then writes it, so an entry
        of one stream may follow a later-stamped one of the other. The latest stamp is
        therefore among the last entries, not always the last (``LAST_ENTRIES``)."""
        try:
            return latest_entry_stamp(self._api, container_id, LAST_ENTRIES)
        except (*TRANSPORT_ERRORS, urllib3.exceptions.HTTPError):
            return None

    def _exited_attrs(self, container_id: str, stopped_for: StopReason | None) -> dict[str, Any]:
        """The exited container's inspect document. A SIGKILL nobody here sent may be the
        kernel's OOM killer, whose event the engine can record just after the exit: such an
        exit is looked at again for a moment before it counts as the tool's own."""
        attrs = self._exited_inspect(container_id)
        for pause in OOM_EVENT_WAITS:
            state = attrs["State"]
            killed = int(state.get("ExitCode", -1)) == SIGKILL_EXIT and stopped_for is None
            if not killed or state.get("OOMKilled"):
                return attrs
            time.sleep(pause)
            attrs = self._exited_inspect(container_id)
        if not attrs["State"].get("OOMKilled") and self._oom_event_seen(container_id, attrs):
            # The engine clears the flag when the kernel's OOM note reaches it after the exit;
            # the "oom" event it logged for the container still says what happened.
            attrs["State"]["OOMKilled"] = True
        return attrs

    def _oom_event_seen(self, container_id: str, attrs: dict[str, Any]) -> bool:
        """Whether the engine's event log holds an "oom" event for this container."""
        created = parse_docker_time(attrs.get("Created"))
        since = int(created.timestamp()) if created is not None else int(time.time()) - 3600
        try:
            events = self._api.events(
                since=since,
                until=round(time.time(), 3),
                filters={"container": [container_id], "event": ["oom"]},
                decode=True,
            )
            return any(event.get("Action") == "oom" for event in events)
        except TRANSPORT_ERRORS:
            return False  # no proof either way: the exit stays the tool's own

    def _exited_inspect(self, container_id: str) -> dict[str, Any]:
        attrs = inspect_container(self._api, container_id)
        if attrs is None or attrs["State"]["Status"] in GOING:
            # Released, the next owner sees it missing and requeues it as container_lost.
            raise RunnerUnavailable(f"container {container_id} disappeared before its outputs")
        return attrs

    def _collect_artifacts(
        self,
        container_id: str,
        spec: AttemptSpec,
        host_dir: Path | None,
        store: ArtifactStore,
        outcome: AttemptResult,
        redactor: Redactor,
    ) -> AttemptResult:
        """Keep the files under ``out/`` as a new set, from the host work directory (if
        ``host_dir``) or the engine's tar stream, the tool's secret values masked; a refusal
        fails a success (``runyard.artifacts.rules``, ``runyard.artifacts.masking``)."""
        limits = ArtifactLimits.of(spec.tool)
        writer = store.writer(spec.run_id)
        try:
            if host_dir is not None:
                kept = collect_dir(host_dir / "out", writer, limits, redactor)
            else:
                kept = self._collect_archive(container_id, writer, limits, redactor)
            writer.done()
        except ArtifactRefused as caught:
            store.discard(spec.run_id, writer.set_id)
            # Its paths are masked already; the message is masked once more, whatever it holds.
            refused = ArtifactRefused(caught.code, redactor.text(caught.message))
            logger.info(
                "artifacts refused",
                extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "error": str(refused)},
            )
            return with_artifacts(outcome, refused, None)
        except (CollectError, *TRANSPORT_ERRORS) as exc:
            store.discard(spec.run_id, writer.set_id)
            raise RunnerUnavailable(f"cannot read the artifacts of {container_id}: {exc}") from exc
        except BaseException:
            store.discard(spec.run_id, writer.set_id)
            raise
        # A line for every attempt that left no file would only repeat its "run finalized".
        logger.log(
            logging.INFO if kept else logging.DEBUG,
            "artifacts collected",
            extra={"run_id": str(spec.run_id), "attempt": spec.attempt, "files": kept},
        )
        return with_artifacts(outcome, None, writer.set_id)

    def _collect_archive(
        self,
        container_id: str,
        writer: ArtifactWriter,
        limits: ArtifactLimits,
        redactor: Redactor,
    ) -> int:
        """``out/`` as the engine's tar stream, member by member."""
        try:
            stream, stat = self._api.get_archive(
                container_id, f"{WORKDIR}/out", chunk_size=CHUNK_SIZE
            )
        except docker.errors.NotFound:
            return 0
        if stat_is_link(stat):
            raise ArtifactRefused(ErrorCode.INVALID_ARTIFACT, "/runyard/out is a link")
        return collect_tar(stream, writer, limits, redactor=redactor)

    def _read_result(
        self, container_id: str, spec: AttemptSpec, attrs: dict[str, Any], cap: int, depth: int
    ) -> tuple[Any | None, str | None]:
        """Read ``out/result.json`` from the host work directory, or else as a tar stream
        from the engine (checked by ``parse_result_archive``)."""
        labels = attrs.get("Config", {}).get("Labels") or {}
        workdirs = self._dirs.workdirs
        if workdirs is not None and self._dirs.host_dir(spec.container_name, labels):
            return workdirs.read_result(spec.container_name, cap, depth)
        try:
            stream, stat = self._api.get_archive(container_id, f"{WORKDIR}/out/result.json")
            return parse_result_archive(stat, stream, cap, depth)
        except docker.errors.NotFound:
            return None, None
        except TRANSPORT_ERRORS as exc:
            raise RunnerUnavailable(f"cannot read the result of {container_id}: {exc}") from exc


def _may_hold_artifacts(out: Path) -> bool:
    """Whether ``out`` holds anything but ``result.json`` (or cannot be listed: the collection
    then says why)."""
    try:
        names = os.listdir(out)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return not all(is_result(name) for name in names)
