"""Log-log charts as inline SVG text, drawn here (no matplotlib: it is optional in kdtree), for
the HTML report. Every label is escaped: series names come from records, which may hold anything."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Sequence

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#d62728")
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 30, 46


@dataclass(frozen=True)
class Series:
    """Points of one label; `style` is "points" (markers), "line" (markers joined), "roof" (a thin
    black line, no markers: a measured ceiling) or "ring" (red rings: figures above a ceiling)."""

    label: str
    points: tuple[tuple[float, float], ...]
    style: str = "points"
    color: str = "#1f77b4"
    dash: str = ""


@dataclass(frozen=True)
class _Axis:
    low: float          # log10 of the ends
    high: float
    base: int
    start: float        # pixel of `low`
    length: float       # pixels from low to high (negative for y: up the page)

    def pixel(self, value: float) -> float:
        return self.start + (math.log10(value) - self.low) / (self.high - self.low) * self.length

    def ticks(self) -> list[float]:
        step = math.log10(self.base)
        first, last = math.ceil(self.low / step - 1e-9), math.floor(self.high / step + 1e-9)
        stride = max(1, math.ceil((last - first + 1) / 8))          # at most about 8 labels
        return [self.base ** k for k in range(first, last + 1, stride)]


def _bounds(values: Sequence[float]) -> tuple[float, float]:
    low, high = math.log10(min(values)), math.log10(max(values))
    pad = max(0.15, (high - low) * 0.06)
    return low - pad, high + pad


def _label(value: float) -> str:
    if value >= 1e5 or value < 1e-3:
        return f"{value:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{value:g}"


def log_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, x_base: int = 10,
              width: int = 560, height: int = 360, empty: str = "nothing to plot") -> str:
    """One chart, both axes logarithmic; points at or below zero are left out."""
    points = [(x, y) for s in series for x, y in s.points if x > 0 and y > 0]
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
            f'<text x="{width / 2:.0f}" y="18" class="title">{escape(title)}</text>')
    if not points:
        return head + f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" class="title">{escape(empty)}</text></svg>'
    plot_w, plot_h = width - MARGIN_LEFT - MARGIN_RIGHT, height - MARGIN_TOP - MARGIN_BOTTOM
    x = _Axis(*_bounds([p[0] for p in points]), x_base, MARGIN_LEFT, plot_w)
    y = _Axis(*_bounds([p[1] for p in points]), 10, MARGIN_TOP + plot_h, -plot_h)
    parts = [head, f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    for tick in x.ticks():
        px = x.pixel(tick)
        parts.append(f'<line x1="{px:.1f}" y1="{MARGIN_TOP}" x2="{px:.1f}" y2="{MARGIN_TOP + plot_h}" class="grid"/>'
                     f'<text x="{px:.1f}" y="{MARGIN_TOP + plot_h + 15}" class="tick">{_label(tick)}</text>')
    for tick in y.ticks():
        py = y.pixel(tick)
        parts.append(f'<line x1="{MARGIN_LEFT}" y1="{py:.1f}" x2="{MARGIN_LEFT + plot_w}" y2="{py:.1f}" class="grid"/>'
                     f'<text x="{MARGIN_LEFT - 5}" y="{py + 4:.1f}" class="tick ytick">{_label(tick)}</text>')
    parts.append(f'<text x="{MARGIN_LEFT + plot_w / 2:.0f}" y="{height - 8}" class="axis">{escape(x_label)}</text>'
                 f'<text transform="translate(14 {MARGIN_TOP + plot_h / 2:.0f}) rotate(-90)" class="axis">'
                 f'{escape(y_label)}</text>')
    parts.append(f'<svg x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" '
                 f'viewBox="{MARGIN_LEFT} {MARGIN_TOP} {plot_w} {plot_h}" overflow="hidden">')
    for one in series:
        parts.append(_series(one, x, y))
    parts.append("</svg></svg>")
    return "".join(parts)


def _series(series: Series, x: _Axis, y: _Axis) -> str:
    kept = [(px, py) for px, py in series.points if px > 0 and py > 0]
    xy = [(x.pixel(px), y.pixel(py)) for px, py in kept]
    label = escape(series.label)
    out = [f'<g class="series"><title>{label}</title>']
    if series.style in ("line", "roof") and len(xy) > 1:
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in xy)
        color = "#000" if series.style == "roof" else series.color
        dash = f' stroke-dasharray="{escape(series.dash)}"' if series.dash else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.4"{dash}/>')
    if series.style != "roof":
        ring = series.style == "ring"
        for (a, b), (px, py) in zip(xy, kept):
            fill = 'fill="none" stroke="#d62728" stroke-width="1.6"' if ring else f'fill="{series.color}"'
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{7 if ring else 3.2}" {fill} fill-opacity="0.85">'
                       f'<title>{label}: {px:.4g}, {py:.4g}</title></circle>')
    out.append("</g>")
    return "".join(out)


def legend(series: Sequence[Series]) -> str:
    """An HTML list naming each series beside its colour (long lists wrap, which SVG text cannot)."""
    items = []
    for one in series:
        if one.style == "roof":
            line = "dotted" if one.dash.startswith("2") else ("dashed" if one.dash else "solid")
            swatch = f'<span class="swatch roof" style="border-top-style:{line}"></span>'
        elif one.style == "ring":
            swatch = '<span class="swatch ring"></span>'
        else:
            swatch = f'<span class="swatch" style="background:{escape(one.color)}"></span>'
        items.append(f"<li>{swatch}{escape(one.label)}</li>")
    return f'<ul class="legend">{"".join(items)}</ul>'
