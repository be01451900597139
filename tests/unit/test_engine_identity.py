"""The engine identity rules: whose marker it is, and which id an engine takes from it."""

from __future__ import annotations

import pytest

from runyard.runners.docker.engine_marker import (
    LABEL_ENGINE_ID,
    LABEL_FINGERPRINT,
    Marker,
    engine_fingerprint,
    marker_of,
    resolve_engine_id,
)

HERE = {"ID": "KPKH:UJI4", "DockerRootDir": "/var/lib/docker", "Name": "host-a"}


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({}, True),
        ({"ServerVersion": "99.0"}, True),  # an upgrade is the same engine
        ({"ID": "OTHER:KEY"}, False),  # a renewed daemon key
        ({"DockerRootDir": "/srv/docker"}, False),  # a second daemon, or a moved data root
        ({"Name": "host-b"}, False),  # a clone under its own host name
    ],
)
def test_engine_fingerprint__changes_with_id_data_root_and_host_name(
    change: dict[str, str], same: bool
):
    assert (engine_fingerprint({**HERE, **change}) == engine_fingerprint(HERE)) is same


@pytest.mark.parametrize(
    ("marker", "fingerprint", "expected"),
    [
        (Marker("a" * 32, "f1"), "f1", "a" * 32),  # the engine it was made on
        (Marker("a" * 32, None), "f1", "a" * 32),  # made before fingerprints
        (Marker("a" * 32, "f1"), "f2", "derived"),  # a copy on another engine
    ],
)
def test_resolve_engine_id__own_marker_keeps_its_id_a_copy_derives_one(
    marker: Marker, fingerprint: str, expected: str
):
    resolved = resolve_engine_id(marker, fingerprint)
    if expected == "derived":
        assert resolved != marker.engine_id and len(resolved) == 32
        assert resolved == resolve_engine_id(marker, fingerprint)  # every process agrees
        assert resolved != resolve_engine_id(marker, "f3")  # and every copy differs
    else:
        assert resolved == expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (None, None),
        ({}, None),
        ({LABEL_ENGINE_ID: ""}, None),
        ({LABEL_ENGINE_ID: "x"}, Marker("x", None)),
        ({LABEL_ENGINE_ID: "x", LABEL_FINGERPRINT: "f"}, Marker("x", "f")),
    ],
)
def test_marker_of__reads_id_and_fingerprint(
    labels: dict[str, str] | None, expected: Marker | None
):
    assert marker_of(labels) == expected
