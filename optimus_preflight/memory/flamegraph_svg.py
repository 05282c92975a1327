"""Folded stacks to a self-contained SVG icicle graph: no script, no JavaScript, no network.

``torch.cuda._memory_viz.segments`` and ``memory`` turn a memory snapshot into folded
stacks, one ``frame;frame;...;frame bytes`` line per block, and hand them to a formatter.
Torch's default formatter pipes them through Brendan Gregg's ``flamegraph.pl`` and, when
that script is not cached, downloads it from GitHub first. ``render_flamegraph_svg`` draws
the same picture here instead, for machines without the script and without a network.

The drawing is an icicle graph (callers above callees, the whole at the top): stacks with
a common prefix share its boxes, a box's width is proportional to its bytes, children are
ordered largest first, and every box has a ``<title>`` (the browser's tooltip) with the
frame and its size. Boxes narrower than ``MIN_BOX_WIDTH`` pixels are left out, as
``flamegraph.pl`` does, so the file stays small for snapshots with many blocks.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from html import escape

WIDTH = 1200.0
BOX_HEIGHT = 16.0
MARGIN = 10.0
HEADER_HEIGHT = 40.0
FONT_SIZE = 12.0
# Average glyph width of the sans-serif font at FONT_SIZE: labels are cut to fit their box.
CHAR_WIDTH = FONT_SIZE * 0.59
MIN_BOX_WIDTH = 0.1


@dataclass
class FrameNode:
    """One box: a frame reached by one particular path from the root, and its bytes."""

    name: str
    value: int = 0
    children: dict[str, FrameNode] = field(default_factory=dict)


@dataclass(frozen=True)
class Box:
    """A laid-out ``FrameNode``: position in pixels, depth below the root."""

    node: FrameNode
    x: float
    width: float
    depth: int


def parse_folded(text: str) -> list[tuple[list[str], int]]:
    """``(frames, count)`` of each ``frame;frame;... count`` line.

    The count is after the last space (frame names may hold spaces). Lines without an
    integer count, or with a count of zero or less, carry nothing to draw and are skipped.
    """
    stacks: list[tuple[list[str], int]] = []
    for line in text.splitlines():
        stack, _, count = line.strip().rpartition(" ")
        if not stack:
            continue
        try:
            value = int(count)
        except ValueError:
            continue
        if value > 0:
            stacks.append((stack.split(";"), value))
    return stacks


def build_tree(stacks: list[tuple[list[str], int]], root_name: str = "all") -> FrameNode:
    """Merge the stacks into a tree: equal prefixes become one node holding their sum."""
    root = FrameNode(root_name)
    for frames, value in stacks:
        root.value += value
        node = root
        for name in frames:
            node = node.children.setdefault(name, FrameNode(name))
            node.value += value
    return root


def layout(root: FrameNode, width: float = WIDTH - 2 * MARGIN, min_width: float = MIN_BOX_WIDTH) -> list[Box]:
    """Boxes of the tree, parents before children; widths proportional to bytes."""
    if root.value <= 0:
        return []
    scale = width / root.value
    boxes: list[Box] = []
    # Iterative: Python stacks can be deeper than the interpreter's recursion limit.
    pending = [Box(root, MARGIN, root.value * scale, 0)]
    while pending:
        box = pending.pop()
        boxes.append(box)
        x = box.x
        for child in sorted(box.node.children.values(), key=lambda node: (-node.value, node.name)):
            child_width = child.value * scale
            if child_width >= min_width:
                pending.append(Box(child, x, child_width, box.depth + 1))
            x += child_width
    boxes.sort(key=lambda box: (box.depth, box.x))
    return boxes


def format_bytes(nbytes: float) -> str:
    """Binary units with one decimal: ``64.0 MiB``."""
    value = float(nbytes)
    if abs(value) < 1024.0:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024.0
        if abs(value) < 1024.0:
            return f"{value:.1f} {unit}"
    return f"{value / 1024.0:.1f} TiB"


def frame_color(name: str) -> str:
    """A warm colour that depends only on the name: a frame keeps its colour everywhere."""
    digest = zlib.crc32(name.encode("utf-8"))
    red = 205 + digest % 51
    green = 80 + (digest >> 8) % 151
    blue = (digest >> 16) % 56
    return f"rgb({red},{green},{blue})"


def _label(name: str, width: float) -> str:
    fits = int((width - 6) / CHAR_WIDTH)
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[: fits - 2] + ".."


def _box_svg(box: Box, total: int) -> str:
    node = box.node
    y = HEADER_HEIGHT + box.depth * BOX_HEIGHT
    share = 100.0 * node.value / total
    tooltip = f"{node.name} ({format_bytes(node.value)}, {node.value:,} bytes, {share:.2f}%)"
    parts = [
        "<g>",
        f"<title>{escape(tooltip, quote=False)}</title>",
        f'<rect x="{box.x:.3f}" y="{y:.1f}" width="{box.width:.3f}" height="{BOX_HEIGHT - 1:.1f}" '
        f'fill="{frame_color(node.name)}" rx="2" ry="2" data-bytes="{node.value}"/>',
    ]
    label = _label(node.name, box.width)
    if label:
        parts.append(f'<text x="{box.x + 3:.3f}" y="{y + BOX_HEIGHT - 4.5:.1f}">{escape(label, quote=False)}</text>')
    parts.append("</g>")
    return "".join(parts)


def render_flamegraph_svg(folded: str, title: str = "Memory flamegraph") -> str:
    """A complete SVG document for the folded-stack lines ``folded`` (counts in bytes)."""
    root = build_tree(parse_folded(folded))
    boxes = layout(root)
    depth = max((box.depth for box in boxes), default=0)
    height = HEADER_HEIGHT + (depth + 1) * BOX_HEIGHT + MARGIN
    if boxes:
        subtitle = f"{format_bytes(root.value)} in all; a box's width is its share, hover for its size"
    else:
        subtitle = "no memory blocks to draw"
    lines = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH:.0f} {height:.0f}">',
        f"<style>text {{ font-family: Verdana, sans-serif; font-size: {FONT_SIZE:.0f}px; fill: #000; }}"
        " .title { font-size: 17px; } .subtitle { fill: #555; }</style>",
        f'<rect x="0" y="0" width="{WIDTH:.0f}" height="{height:.0f}" fill="#f8f8f8"/>',
        f'<text class="title" x="{WIDTH / 2:.0f}" y="20" text-anchor="middle">{escape(title, quote=False)}</text>',
        f'<text class="subtitle" x="{WIDTH / 2:.0f}" y="35" text-anchor="middle">{escape(subtitle, quote=False)}</text>',
        *(_box_svg(box, root.value) for box in boxes),
        "</svg>",
    ]
    return "\n".join(lines) + "\n"
