"""The input-mode rule: host work directories only when forced or proved, else uploads."""

from __future__ import annotations

import pytest

from runyard.platform.settings import Settings
from runyard.runners.docker.inputs import DEFAULT_ROOT, InputMode, decide_inputs, root_of

POWERS = "host work directories need a root with CAP_CHOWN and CAP_DAC_OVERRIDE"
REMOTE = "the Docker engine does not see /var/lib/runyard/attempts as this process does"


@pytest.mark.parametrize(
    ("setting", "is_root", "powers", "probe", "mode", "root", "reason"),
    [
        ("auto", True, None, None, InputMode.HOST, DEFAULT_ROOT, "the engine read back a marker"),
        (" AUTO ", True, None, None, InputMode.HOST, DEFAULT_ROOT, "read back a marker"),
        ("auto", False, None, None, InputMode.UPLOAD, None, "need the worker to run as root"),
        ("auto", True, POWERS, None, InputMode.UPLOAD, None, "CAP_CHOWN"),
        ("auto", True, None, REMOTE, InputMode.UPLOAD, None, "does not see"),
        ("/srv/attempts", True, None, None, InputMode.HOST, "/srv/attempts", "forced"),
        # A forced root is not probed: the mount failure at the first attempt still falls back.
        ("/srv/attempts", True, None, REMOTE, InputMode.HOST, "/srv/attempts", "forced"),
        ("/srv/attempts", False, None, None, InputMode.REFUSE, "/srv/attempts", "run as root"),
        ("/srv/attempts", True, POWERS, None, InputMode.REFUSE, "/srv/attempts", "CAP_CHOWN"),
        ("relative/dir", True, None, None, InputMode.REFUSE, "relative/dir", "absolute path"),
        ("upload", True, None, None, InputMode.UPLOAD, None, "'upload'"),
        ("off", True, None, None, InputMode.UPLOAD, None, "'off'"),
        ("", True, None, None, InputMode.UPLOAD, None, "''"),
        ("Upload", False, POWERS, REMOTE, InputMode.UPLOAD, None, "'Upload'"),
    ],
)
def test_decide_inputs__table(
    setting: str,
    is_root: bool,
    powers: str | None,
    probe: str | None,
    mode: InputMode,
    root: str | None,
    reason: str,
):
    choice = decide_inputs(setting, is_root=is_root, powers=powers, probe=probe)
    assert (choice.mode, choice.root) == (mode, root)
    assert reason in choice.reason


def test_root_of__auto_is_the_default_root_and_upload_words_are_none():
    assert root_of("auto") == DEFAULT_ROOT == "/var/lib/runyard/attempts"
    assert root_of("/x") == "/x"
    assert [root_of(w) for w in ("", "upload", "OFF")] == [None, None, None]


def test_settings__host_workdir_root_defaults_to_auto(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RUNYARD_HOST_WORKDIR_ROOT", raising=False)
    assert Settings().host_workdir_root == "auto"
