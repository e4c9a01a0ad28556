"""Where the admin draws a workflow's steps (decision 0022 §6): pure functions, no database.

Steps go in layers by their longest path from the sources (a step sits one layer after its latest
parent), drawn left to right, a layer a column; each layer is ordered once, top to bottom, by its
parents' mean position in the layers before it (ties keep the order the steps were given in). The
result is boxes and edges in pixels, for an SVG drawn from a template.

Left to right because wide graphs are the common large ones (a group or chord of many steps): a
fan-out of a hundred is a column the page scrolls down, and its source and sink stay in view.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BOX_WIDTH = 200
BOX_HEIGHT = 44
GAP_X = 64  # between layers (columns): room for the arrows' curves
GAP_Y = 12  # between the steps of one layer
MARGIN = 8


@dataclass(frozen=True)
class Box:
    """A step's box: its layer and place in it, and its top-left corner."""

    step: str
    layer: int
    position: int
    x: int
    y: int
    width: int = BOX_WIDTH
    height: int = BOX_HEIGHT

    @property
    def center_y(self) -> int:
        return self.y + self.height // 2


@dataclass(frozen=True)
class Arrow:
    """An edge from ``parent``'s right side to ``child``'s left; dashed when the parent's death satisfies it."""

    parent: str
    child: str
    allow_failure: bool
    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def path(self) -> str:
        """An SVG path: a curve leaving the parent rightwards and reaching the child from the left."""
        bend = (self.x2 - self.x1) // 2
        return f"M {self.x1} {self.y1} C {self.x1 + bend} {self.y1} {self.x2 - bend} {self.y2} {self.x2} {self.y2}"


@dataclass(frozen=True)
class Layout:
    """A drawn graph: its boxes (in layer order), its arrows, and the size of the drawing."""

    boxes: tuple[Box, ...]
    arrows: tuple[Arrow, ...]
    width: int
    height: int


def layers(steps: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Put ``steps`` in layers by their longest path from a step without parents, each layer
    ordered by its parents' mean position. ``edges`` are (parent, child) pairs; an edge naming an
    unknown step, and any step on a cycle, are ignored (the schema allows neither)."""
    parents = _parents(steps, edges)
    depth: dict[str, int] = {}
    for step in _topological(steps, parents):
        depth[step] = 1 + max((depth[parent] for parent in parents[step]), default=-1)
    order = {step: index for index, step in enumerate(steps)}
    rows: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for step in steps:
        if step in depth:
            rows[depth[step]].append(step)
    position: dict[str, int] = {}
    for row in rows:
        row.sort(key=lambda step: (_mean(position[p] for p in parents[step]), order[step]))
        position.update((step, index) for index, step in enumerate(row))
    return rows


def layout(steps: Sequence[str], edges: Iterable[tuple[str, str, bool]]) -> Layout:
    """Boxes and arrows for ``steps`` and their (parent, child, allow_failure) ``edges``: a layer a
    column, each centred beside the tallest one."""
    edges = list(edges)
    columns = layers(steps, ((parent, child) for parent, child, _ in edges))
    tallest = max((len(column) for column in columns), default=0)
    height = 2 * MARGIN + tallest * BOX_HEIGHT + max(tallest - 1, 0) * GAP_Y
    boxes: dict[str, Box] = {}
    for depth, column in enumerate(columns):
        column_height = len(column) * BOX_HEIGHT + (len(column) - 1) * GAP_Y
        top = (height - column_height) // 2
        for index, step in enumerate(column):
            x, y = MARGIN + depth * (BOX_WIDTH + GAP_X), top + index * (BOX_HEIGHT + GAP_Y)
            boxes[step] = Box(step, depth, index, x, y)
    arrows = [
        Arrow(
            parent,
            child,
            allow,
            boxes[parent].x + BOX_WIDTH,
            boxes[parent].center_y,
            boxes[child].x,
            boxes[child].center_y,
        )  # fmt: skip
        for parent, child, allow in edges
        if parent in boxes and child in boxes
    ]
    width = 2 * MARGIN + len(columns) * BOX_WIDTH + max(len(columns) - 1, 0) * GAP_X
    return Layout(tuple(boxes.values()), tuple(arrows), width, height)


def _parents(steps: Sequence[str], edges: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    parents: dict[str, list[str]] = {step: [] for step in steps}
    for parent, child in edges:
        if parent in parents and child in parents and parent not in parents[child]:
            parents[child].append(parent)
    return parents


def _topological(steps: Sequence[str], parents: dict[str, list[str]]) -> list[str]:
    """Kahn's order, ties in the order of ``steps``."""
    children: dict[str, list[str]] = {step: [] for step in steps}
    pending = {step: len(parents[step]) for step in steps}
    for step in steps:
        for parent in parents[step]:
            children[parent].append(step)
    ready = deque(step for step in steps if not pending[step])
    order: list[str] = []
    while ready:
        step = ready.popleft()
        order.append(step)
        for child in children[step]:
            pending[child] -= 1
            if not pending[child]:
                ready.append(child)
    return order


def _mean(values: Iterable[int]) -> float:
    numbers = list(values)
    return sum(numbers) / len(numbers) if numbers else 0.0
