"""The batch page's graph: the layered layout (a table), and the SVG drawn from it."""

from __future__ import annotations

import itertools
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from api.ui.batch_graph import batch_graph, natural_key, ref_link
from api.ui.graph_layout import GAP_X, GAP_Y, NODE_H, NODE_W, PAD, Box, layout
from api.ui.graph_layout import longest_path_layers as layers
from runyard.submission.batches import BatchRun

SVG = "{http://www.w3.org/2000/svg}"
AT = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
Graph = list[tuple[str, Sequence[str]]]


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([], {}),
        ([("a", [])], {"a": 0}),
        ([("a", []), ("b", ["a"]), ("c", ["b"])], {"a": 0, "b": 1, "c": 2}),
        # Longest path, not shortest: d waits for a directly and through b and c.
        (
            [("a", []), ("b", ["a"]), ("c", ["b"]), ("d", ["a", "c"])],
            {"a": 0, "b": 1, "c": 2, "d": 3},
        ),
        # Diamond.
        (
            [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])],
            {"a": 0, "b": 1, "c": 1, "d": 2},
        ),
        # Order given does not matter; names outside the graph (run ids) and itself ignored.
        ([("z", ["y", "0f1e-run-id"]), ("y", ["y"])], {"y": 0, "z": 1}),
        # A repeated name counts once, as first given.
        ([("a", []), ("b", ["a"]), ("b", [])], {"a": 0, "b": 1}),
        # Cannot be submitted, yet drawn: a cycle's runs go after what is placed.
        ([("a", []), ("b", ["a", "c"]), ("c", ["b"])], {"a": 0, "b": 1, "c": 2}),
    ],
)
def test_layers__longest_path_table(nodes: Graph, expected: dict[str, int]):
    assert layers(nodes) == expected


def _at(layer_column: int, row: int) -> tuple[int, int]:
    return PAD + layer_column * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y)


@pytest.mark.parametrize(
    ("nodes", "max_rows", "expected"),
    [
        # ref: (layer, column, row)
        ([("a", [])], 25, {"a": (0, 0, 0)}),
        (
            [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])],
            25,
            {"a": (0, 0, 0), "b": (1, 1, 0), "c": (1, 1, 1), "d": (2, 2, 0)},
        ),
        # Within a layer, runs follow where their dependencies sit (x under b, y under a).
        (
            [("a", []), ("b", []), ("x", ["b"]), ("y", ["a"])],
            25,
            {"a": (0, 0, 0), "b": (0, 0, 1), "y": (1, 1, 0), "x": (1, 1, 1)},
        ),
        # A layer taller than max_rows wraps into more columns; the next layer moves right.
        (
            [("a", []), ("b", []), ("c", []), ("d", ["a"])],
            2,
            {"a": (0, 0, 0), "b": (0, 0, 1), "c": (0, 1, 0), "d": (1, 2, 0)},
        ),
    ],
)
def test_layout__positions_table(
    nodes: Graph, max_rows: int, expected: dict[str, tuple[int, int, int]]
):
    drawn = layout(nodes, max_rows=max_rows)
    for name, (layer, column, row) in expected.items():
        assert drawn.boxes[name] == Box(layer, column, row, *_at(column, row)), name
    columns = 1 + max(column for _, column, _ in expected.values())
    rows = 1 + max(row for _, _, row in expected.values())
    assert drawn.width == 2 * PAD + columns * NODE_W + (columns - 1) * GAP_X
    assert drawn.height == 2 * PAD + rows * NODE_H + (rows - 1) * GAP_Y


def test_layout__edges_are_the_dependencies_inside_the_graph_once_each():
    drawn = layout([("a", []), ("b", ["a", "a", "outside"]), ("c", ["a", "b", "c"])])
    assert drawn.edges == (("a", "b"), ("a", "c"), ("b", "c"))
    assert drawn.layers == 3


def test_layout__empty_graph_is_an_empty_drawing():
    drawn = layout([])
    assert (drawn.boxes, drawn.edges, drawn.layers) == ({}, (), 0)
    assert (drawn.width, drawn.height) == (2 * PAD, 2 * PAD)


def _overlap(a: Box, b: Box) -> bool:
    return a.x < b.x + NODE_W and b.x < a.x + NODE_W and a.y < b.y + NODE_H and b.y < a.y + NODE_H


def _mixed(n: int) -> Graph:
    """A batch-sized graph: chains, fan-outs and joins (each run waits for up to three
    earlier ones)."""
    return [(f"r{i}", [f"r{j}" for j in (i - 1, i // 2, i - 7) if 0 <= j < i]) for i in range(n)]


@pytest.mark.parametrize(
    "nodes",
    [
        _mixed(1000),
        [(f"r{i}", []) for i in range(1000)],  # all independent: one wrapped layer
        [(f"r{i}", [f"r{i - 1}"] if i else []) for i in range(1000)],  # one long chain
    ],
    ids=["mixed", "independent", "chain"],
)
def test_layout__a_thousand_runs_never_overlap_and_fit_the_drawing(nodes: Graph):
    drawn = layout(nodes)
    boxes = list(drawn.boxes.values())
    assert len(boxes) == 1000
    by_place = sorted(boxes, key=lambda box: (box.x, box.y))
    for a, b in itertools.pairwise(by_place):
        assert (a.x, a.y) != (b.x, b.y)
    # Boxes sit on a grid of whole cells, so distinct corners cannot overlap; check the
    # neighbours in each column anyway, and the bounds.
    for a, b in itertools.pairwise(by_place):
        if a.x == b.x:
            assert not _overlap(a, b)
    assert all(0 < box.x and box.x + NODE_W <= drawn.width - PAD for box in boxes)
    assert all(0 < box.y and box.y + NODE_H <= drawn.height - PAD for box in boxes)
    # Every dependency is drawn to the left of its dependent.
    for dep, name in drawn.edges:
        assert drawn.boxes[dep].x < drawn.boxes[name].x


def test_layout__no_two_boxes_overlap_in_a_small_wrapped_graph():
    drawn = layout(_mixed(60), max_rows=4)
    for a, b in itertools.combinations(drawn.boxes.values(), 2):
        assert not _overlap(a, b)


def test_natural_key__numbers_sort_as_numbers():
    refs = ["#10", "#2", "build", "#1", "a10", "a9"]
    assert sorted(refs, key=natural_key) == ["#1", "#2", "#10", "a9", "a10", "build"]


def run(
    ref: str, status: str = "queued", depends_on: Sequence[str] = (), **more: object
) -> BatchRun:
    fields: dict[str, object] = {
        "ref": ref,
        "run_id": uuid.uuid4(),
        "tool": "echo",
        "status": status,
        "error_code": None,
        "depends_on": tuple(depends_on),
        "rerun_of": None,
        "requested_at": AT,
        "finished_at": None,
        **more,
    }
    return BatchRun(**fields)  # type: ignore[arg-type]


def test_batch_graph__a_linked_node_per_ref_coloured_by_status_and_an_edge_per_dependency():
    outside = str(uuid.uuid4())
    runs = [
        run("test", "running", ["build", outside]),
        run("build", "succeeded"),
        run("lint", "failed", error_code="tool_failed"),
        run("ship", "queued", ["test", "lint"]),
    ]
    root = ET.fromstring(str(batch_graph(runs, {runs[3].run_id})))
    assert root.tag == f"{SVG}svg"
    nodes = root.findall(f".//{SVG}a")
    by_ref = {node.get("data-ref"): node for node in nodes}
    assert set(by_ref) == {"build", "test", "lint", "ship"}
    for item in runs:
        node = by_ref[item.ref]
        assert node.get("href") == f"/ui/runs/{item.run_id}"
        assert node.get("class") == f"node s-{item.status}"
    ship_title = by_ref["ship"].find(f"{SVG}title")
    assert ship_title is not None and "scheduled" in str(ship_title.text)
    test_title = by_ref["test"].find(f"{SVG}title")
    assert test_title is not None and "1 run(s) outside the batch" in str(test_title.text)
    edges = root.findall(f".//{SVG}path[@marker-end]")
    shown = sorted((str(edge.get("class")), str(edge.findtext(f"{SVG}title"))) for edge in edges)
    assert shown == [
        ("edge met", "test depends on build"),
        ("edge pending", "ship depends on lint"),
        ("edge pending", "ship depends on test"),
    ]
    assert int(str(root.get("width"))) > 0 and root.get("viewBox", "").startswith("0 0 ")


def test_batch_graph__escapes_what_it_draws_and_clips_long_refs():
    hostile = run("a" * 64, "failed", error_code='<script>alert("x")</script>')
    hostile = BatchRun(**{**vars(hostile), "tool": "<img src=x onerror=alert(1)>"})
    svg = str(batch_graph([hostile]))
    assert "<script>" not in svg and "<img" not in svg
    assert "&lt;script&gt;" in svg and "&lt;img src=x" in svg
    root = ET.fromstring(svg)  # still well-formed XML
    texts = [str(t.text) for t in root.iter(f"{SVG}text")]
    assert texts[0] == "a" * 20 + "…"


def test_batch_graph__draws_at_most_the_limit():
    runs = [run(f"#{i}") for i in range(30)]
    root = ET.fromstring(str(batch_graph(runs, limit=10)))
    refs = [node.get("data-ref") for node in root.iter(f"{SVG}a")]
    assert refs == [f"#{i}" for i in range(10)]
    assert "(the first 10 of 30)" in str(root.findtext(f"{SVG}desc"))


def test_ref_link__default_refs_are_escaped_in_the_fragment():
    batch = uuid.UUID("00000000-0000-4000-8000-000000000001")
    assert ref_link(batch, "#3") == f"/ui/batches/{batch}#ref-%233"
    assert ref_link(batch, "build.v2") == f"/ui/batches/{batch}#ref-build.v2"
