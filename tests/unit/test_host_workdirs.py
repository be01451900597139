"""Attempt work directories on the engine's host: layout, ownership, safe removal."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from runyard.domain.attempt import container_name
from runyard.runner import RunnerUnavailable
from runyard.runners.docker.host_workdirs import HostWorkdirs, parse_attempt_name

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the tool's uid needs root")


def files(input_value: object) -> dict[str, bytes]:
    return {"input.json": json.dumps(input_value).encode()}


def test_attempt_names__parse_only_runyard_attempts():
    run_id = uuid.uuid4()
    assert parse_attempt_name(container_name(run_id, 3)) == (run_id, 3)
    for name in ("runyard-engine-marker", f"runyard-{run_id}-0", f"x-{run_id}-1", "../etc", ""):
        assert parse_attempt_name(name) is None


def test_path__refuses_names_that_are_not_attempts(tmp_path: Path):
    with pytest.raises(ValueError, match="not an attempt name"):
        HostWorkdirs(tmp_path).path("../../etc")


def test_open__refuses_a_relative_root():
    with pytest.raises(ValueError, match="absolute"):
        HostWorkdirs.open("relative/dir")


@needs_root
def test_prepare__input_read_only_for_everyone_and_out_owned_by_the_tool(tmp_path: Path):
    dirs = HostWorkdirs.open(str(tmp_path / "root"))
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o700
    name = container_name(uuid.uuid4(), 1)
    assert dirs.prepare(name, files({"a": [1, "x"]}), "1234:5678") is True
    path = dirs.path(name)
    info = (path / "input.json").stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o444)
    assert json.loads((path / "input.json").read_text()) == {"a": [1, "x"]}
    out = (path / "out").stat()
    assert (out.st_uid, out.st_gid, stat.S_IMODE(out.st_mode)) == (1234, 5678, 0o755)
    assert dirs.volume_options(name) == {"type": "none", "o": "bind", "device": str(path)}


@needs_root
def test_prepare__leaves_an_existing_directory_alone_and_reset_replaces_it(tmp_path: Path):
    dirs = HostWorkdirs.open(str(tmp_path))
    name = container_name(uuid.uuid4(), 2)
    assert dirs.prepare(name, files({"v": 1}), "65534")
    (dirs.path(name) / "out" / "result.json").write_text("{}")
    assert dirs.prepare(name, files({"v": 2}), "65534") is False
    assert (dirs.path(name) / "out" / "result.json").exists()
    dirs.reset(name, files({"v": 3}), "65534")
    assert not (dirs.path(name) / "out" / "result.json").exists()
    assert json.loads((dirs.path(name) / "input.json").read_text()) == {"v": 3}


@needs_root
def test_remove__does_not_follow_links_the_tool_left(tmp_path: Path):
    dirs = HostWorkdirs.open(str(tmp_path / "root"))
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    name = container_name(uuid.uuid4(), 1)
    dirs.prepare(name, files({}), "65534")
    (dirs.path(name) / "out" / "link").symlink_to(outside)
    (dirs.path(name) / "out" / "file-link").symlink_to(outside / "keep.txt")
    dirs.remove(name)
    dirs.remove(name)  # already gone: nothing to do
    assert not dirs.path(name).exists()
    assert (outside / "keep.txt").read_text() == "keep"


@needs_root
def test_attempts__lists_attempt_directories_only(tmp_path: Path):
    dirs = HostWorkdirs.open(str(tmp_path))
    run_id = uuid.uuid4()
    dirs.prepare(container_name(run_id, 1), files({}), "65534")
    dirs.prepare(container_name(run_id, 2), {}, "65534")
    (tmp_path / "stray").mkdir()
    assert sorted(dirs.attempts()) == [(run_id, 1), (run_id, 2)]


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[HostWorkdirs, str, Path]:
    dirs = HostWorkdirs(tmp_path)
    name = container_name(uuid.uuid4(), 1)
    (tmp_path / name / "out").mkdir(parents=True)
    return dirs, name, tmp_path / name / "out"


def test_read_result__absent_is_no_result(prepared: tuple[HostWorkdirs, str, Path]):
    dirs, name, _ = prepared
    assert dirs.read_result(name, 1024) == (None, None)


def test_read_result__a_small_json_file_is_the_result(prepared: tuple[HostWorkdirs, str, Path]):
    dirs, name, out = prepared
    (out / "result.json").write_text('{"ok": [1, 2]}')
    assert dirs.read_result(name, 1024) == ({"ok": [1, 2]}, None)


def test_read_result__refuses_links_dirs_fifos_big_and_broken_files(
    prepared: tuple[HostWorkdirs, str, Path], tmp_path: Path
):
    dirs, name, out = prepared
    secret = tmp_path / "secret.json"
    secret.write_text('{"secret": true}')
    result = out / "result.json"
    result.symlink_to(secret)
    link_refused = "result.json is a link; only a regular file is accepted"
    assert dirs.read_result(name, 1024)[1] == link_refused
    result.unlink()
    result.mkdir()
    assert dirs.read_result(name, 1024)[1] == "result.json must be a single regular file"
    result.rmdir()
    os.mkfifo(result)
    assert dirs.read_result(name, 1024)[1] == "result.json must be a single regular file"
    result.unlink()
    result.write_text('{"a": "' + "x" * 2000 + '"}')
    assert dirs.read_result(name, 1024)[1] == "result.json is larger than 1024 bytes"
    result.write_text("{not json")
    value, problem = dirs.read_result(name, 1024)
    assert value is None and (problem or "").startswith("result.json: Expecting property name")


def test_read_result__out_replaced_by_a_link_is_not_followed(tmp_path: Path):
    dirs = HostWorkdirs(tmp_path / "root")
    name = container_name(uuid.uuid4(), 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "result.json").write_text('{"secret": true}')
    (tmp_path / "root" / name).mkdir(parents=True)
    (tmp_path / "root" / name / "out").symlink_to(elsewhere)
    value, problem = dirs.read_result(name, 1024)
    assert value is None and problem is not None and "secret" not in problem


def test_read_result__a_missing_directory_is_engine_trouble(tmp_path: Path):
    with pytest.raises(RunnerUnavailable, match="gone"):
        HostWorkdirs(tmp_path).read_result(container_name(uuid.uuid4(), 1), 1024)


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_open__refuses_a_root_that_cannot_chown(tmp_path: Path):
    script = (
        "from runyard.runners.docker.host_workdirs import HostWorkdirs\n"
        f"HostWorkdirs.open({str(tmp_path / 'root')!r})\n"
    )
    done = subprocess.run(
        ["setpriv", "--bounding-set=-chown", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "need a root with CAP_CHOWN and CAP_DAC_OVERRIDE" in done.stderr
    assert list((tmp_path / "root").iterdir()) == []


@pytest.mark.slow  # starts the worker in a process of its own
def test_worker__a_bad_root_stops_it_at_start_with_the_reason(tmp_path: Path):
    env = {
        **os.environ,
        "RUNYARD_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "RUNYARD_HOST_WORKDIR_ROOT": "relative/attempts",
    }
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "RUNYARD_HOST_WORKDIR_ROOT must be an absolute path" in done.stderr
