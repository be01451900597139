"""Where the batch page draws each run: a layered layout, left to right, in which a run's
layer is the length of the longest chain of dependencies before it. Layers taller than
``max_rows`` wrap into several columns, so a wide batch stays a block that scrolls rather
than one endless column. Pure: names in, boxes out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NODE_W, NODE_H = 176, 44
GAP_X, GAP_Y = 56, 14
PAD = 12
MAX_ROWS = 25


@dataclass(frozen=True)
class Box:
    """A node's place: its layer, its column in the drawing, its row, and its corner."""

    layer: int
    column: int
    row: int
    x: int
    y: int


@dataclass(frozen=True)
class Layout:
    """Boxes by name, the edges to draw (dependency, dependent), and the drawing's size."""

    boxes: dict[str, Box]
    edges: tuple[tuple[str, str], ...]
    width: int
    height: int
    layers: int


def _dependencies(nodes: Sequence[tuple[str, Sequence[str]]]) -> dict[str, list[str]]:
    """Each name's dependencies among the nodes, once each, itself left out; a repeated
    name counts once, as first given."""
    names = {name for name, _ in nodes}
    deps: dict[str, list[str]] = {}
    for name, depends_on in nodes:
        if name not in deps:
            deps[name] = list(dict.fromkeys(d for d in depends_on if d in names and d != name))
    return deps


def longest_path_layers(nodes: Sequence[tuple[str, Sequence[str]]]) -> dict[str, int]:
    """Each node's layer: 0 without dependencies among ``nodes``, else one more than its
    deepest dependency. Names not among the nodes and repeated names are ignored; should
    the edges form a cycle, its nodes are placed after the dependencies already placed."""
    deps = _dependencies(nodes)
    waiting = {name: len(found) for name, found in deps.items()}
    dependents: dict[str, list[str]] = {name: [] for name in deps}
    for name, found in deps.items():
        for dep in found:
            dependents[dep].append(name)
    layer: dict[str, int] = {}
    ready = [name for name in deps if waiting[name] == 0]
    while ready:
        name = ready.pop()
        layer[name] = 1 + max((layer[d] for d in deps[name]), default=-1)
        for dependent in dependents[name]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    for name in deps:
        if name not in layer:  # on a cycle: only what is placed counts
            layer[name] = 1 + max((layer[d] for d in deps[name] if d in layer), default=-1)
    return layer


def layout(nodes: Sequence[tuple[str, Sequence[str]]], max_rows: int = MAX_ROWS) -> Layout:
    """Place ``(name, depends_on)`` nodes: a layer per column group, each layer ordered by
    where its dependencies sit (ties in the order given), wrapped at ``max_rows``."""
    layer_of = longest_path_layers(nodes)
    order = {name: i for i, name in reversed(list(enumerate(name for name, _ in nodes)))}
    deps = _dependencies(nodes)
    count = 1 + max(layer_of.values(), default=-1)
    members: list[list[str]] = [[] for _ in range(count)]
    for name in sorted(layer_of, key=order.__getitem__):
        members[layer_of[name]].append(name)
    position: dict[str, int] = {}
    for names in members:

        def barycenter(name: str) -> float:
            placed = [position[d] for d in deps[name] if d in position]
            return sum(placed) / len(placed) if placed else -1.0

        names.sort(key=lambda name: (barycenter(name), order[name]))
        position.update((name, index) for index, name in enumerate(names))
    boxes: dict[str, Box] = {}
    column = 0
    tallest = 0
    for index, names in enumerate(members):
        for place, name in enumerate(names):
            sub, row = divmod(place, max_rows)
            x = PAD + (column + sub) * (NODE_W + GAP_X)
            y = PAD + row * (NODE_H + GAP_Y)
            boxes[name] = Box(layer=index, column=column + sub, row=row, x=x, y=y)
        column += math.ceil(len(names) / max_rows)
        tallest = max(tallest, min(len(names), max_rows))
    edges = tuple(
        (dep, name) for name in sorted(boxes, key=order.__getitem__) for dep in deps[name]
    )
    width = 2 * PAD + column * NODE_W + max(column - 1, 0) * GAP_X
    height = 2 * PAD + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    return Layout(boxes=boxes, edges=edges, width=width, height=height, layers=count)
