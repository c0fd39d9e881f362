"""Bar charts as SVG text, drawn on the server for the console (whose CSP allows no script).

Pure: series in, markup out. Stacked bars, one per bucket (e.g. an hour), each stack split by
series (e.g. status class) in a fixed order; the tallest stack fills the plot height and every
other scales linearly to it. Every label and title is escaped here (the markup is inserted into
the page unescaped), and each bar has a ``<title>`` so a pointer over it reads its figures without
any script. Colours come from CSS classes (``bar-<series>``) the console's stylesheet defines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 720
HEIGHT = 180
LEFT = 44  # room for the axis' top value
BOTTOM = 20  # room for the bucket labels
TOP = 8
GAP = 2  # between bars


@dataclass(frozen=True)
class Bucket:
    label: str  # under the bar, and in its title
    values: Mapping[str, float]  # series -> value; a missing series is 0


def _cls(series: str) -> str:
    return "bar-" + re.sub(r"[^a-z0-9]+", "-", series.lower()).strip("-")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"


def stacked_bars(buckets: Sequence[Bucket], series: Sequence[str], title: str, unit: str = "",
                 label_every: int = 1) -> str:
    """One ``<rect>`` per (bucket, series) with a value above 0, grouped per bucket in a ``<g
    class="bucket">``; ``label_every``: label every n-th bucket (24 hourly labels do not fit)."""
    top = max((sum(max(0.0, b.values.get(s, 0.0)) for s in series) for b in buckets), default=0.0)
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(buckets))
    bar_w = max(1.0, step - GAP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>",
             f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}"/>',
             f'<text class="axis-label" x="{LEFT - 4}" y="{TOP + 10}" text-anchor="end">'
             f"{escape(_fmt(top) + unit)}</text>"]
    for i, b in enumerate(buckets):
        x = LEFT + i * step
        figures = ", ".join(f"{s} {_fmt(b.values.get(s, 0.0))}{unit}" for s in series if b.values.get(s, 0.0))
        parts.append(f'<g class="bucket"><title>{escape(b.label)}: {escape(figures or "none")}</title>')
        y = float(TOP + plot_h)
        for s in series:
            v = max(0.0, b.values.get(s, 0.0))
            if v <= 0 or top <= 0:
                continue
            h = plot_h * v / top
            y -= h
            parts.append(f'<rect class="{_cls(s)}" x="{x:.2f}" y="{y:.2f}" width="{bar_w:.2f}" height="{h:.2f}"/>')
        parts.append("</g>")
        if i % max(1, label_every) == 0:
            parts.append(f'<text class="bucket-label" x="{x + bar_w / 2:.2f}" y="{HEIGHT - 6}" '
                         f'text-anchor="middle">{escape(b.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def legend(series: Sequence[str]) -> str:
    """The series' names with their colours, as HTML (the chart itself has no legend)."""
    return '<ul class="legend">' + "".join(
        f'<li><span class="swatch {_cls(s)}"></span>{escape(s)}</li>' for s in series) + "</ul>"
