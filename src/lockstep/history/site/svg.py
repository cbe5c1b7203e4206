"""Charts as SVG text, written by lockstep: no script, no library, nothing fetched. Each point is a
<circle> whose <title> is its tooltip (every browser shows it on hover) inside a link to the run;
a band is one <path>. docs/reference/history-site.md says why SVG and not a charting library."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 920, 210
LEFT, RIGHT, TOP, BOTTOM = 72, 44, 24, 46
LOG_FLOOR = 1e-12  # a log axis cannot show 0 (bitwise agreement): drawn here, and the axis says so


@dataclass
class Mark:
    """One x position: a value, an optional band (lo..hi), a colour, the tooltip and a link."""

    label: str  # the x label (a commit)
    y: float | None
    lo: float | None = None
    hi: float | None = None
    color: str = "#3465a4"
    tip: str = ""
    href: str | None = None


def fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.{digits - 1}e}"
    return f"{v:,.{max(0, digits - 1 - int(math.floor(math.log10(a))))}f}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


@dataclass(frozen=True)
class _Axes:
    """Where a value and an x position land on the plot area: the y range after ticks are chosen."""

    log: bool
    lo: float  # the bottom of the y axis, on its own scale (log10 when `log`)
    hi: float
    ticks: list[float]
    n: int  # marks along x

    def tr(self, v: float) -> float:
        return math.log10(max(v, LOG_FLOOR)) if self.log else v

    def x(self, i: int) -> float:
        return LEFT + ((WIDTH - LEFT - RIGHT) * (i + 0.5) / self.n)

    def y(self, v: float) -> float:
        return self.y_of_scaled(self.tr(v))

    def y_of_scaled(self, t: float) -> float:
        ph = HEIGHT - TOP - BOTTOM
        return TOP + ph - (t - self.lo) / (self.hi - self.lo) * ph


def chart(title: str, marks: list[Mark], *, log: bool = False, lines: list[tuple[float, str]] = (),
          unit: str = "", css_class: str = "chart") -> str:
    """One panel: the marks in order along x, `lines` (value, label) drawn across it dashed."""
    w, h = WIDTH, HEIGHT
    values = [v for m in marks for v in (m.y, m.lo, m.hi) if v is not None and math.isfinite(v)]
    values += [v for v, _ in lines if math.isfinite(v)]
    head = (f'<svg class="{css_class}" viewBox="0 0 {w} {h}" width="{w}" '
            f'height="{h}" role="img" aria-label="{escape(title)}"><text class="t" x="{LEFT}" y="15">'
            f'{escape(title)}</text>')
    if not values:
        return head + (f'<text class="empty" x="{w / 2}" y="{h / 2}" text-anchor="middle">nothing to draw: '
                       'no run of this series has this figure</text></svg>')
    axes = _axes(values, log, len(marks))
    out = [head, f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{w - LEFT - RIGHT}" height="{h - TOP - BOTTOM}"/>']
    out += _y_axis(axes, unit)
    out += _x_labels(axes, marks)
    out += _band(axes, marks)
    out += _reference_lines(axes, lines)
    out += _points(axes, marks)
    out.append("</svg>")
    return "".join(out)


def _axes(values: list[float], log: bool, n: int) -> _Axes:
    """A log axis spans whole decades; a linear one is padded a little and starts and ends on a tick."""
    scaled = [math.log10(max(v, LOG_FLOOR)) if log else v for v in values]
    lo, hi = min(scaled), max(scaled)
    if log:
        lo, hi = math.floor(lo), math.ceil(hi) if math.ceil(hi) > math.floor(lo) else math.floor(lo) + 1
        ticks = [float(t) for t in range(int(lo), int(hi) + 1)]
    else:
        pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
        ticks = _nice_ticks(lo - pad, hi + pad)
        lo, hi = ticks[0], ticks[-1]
    return _Axes(log=log, lo=lo, hi=hi, ticks=ticks, n=n)


def _y_axis(axes: _Axes, unit: str) -> list[str]:
    out = []
    for t in axes.ticks:
        y = axes.y_of_scaled(t)
        label = (f"1e{int(t)}" if t > math.log10(LOG_FLOOR) else "0") if axes.log else fmt(t)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="yl" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    if unit:
        out.append(f'<text class="yl" x="{LEFT - 6}" y="{TOP - 8}" text-anchor="end">{escape(unit)}</text>')
    return out


def _x_labels(axes: _Axes, marks: list[Mark]) -> list[str]:
    n = axes.n
    every = max(1, math.ceil(n / 24))  # at most ~24 commit labels, whatever the page holds
    return [f'<text class="xl" transform="translate({axes.x(i):.1f},{HEIGHT - BOTTOM + 10}) rotate(35)">'
            f'{escape(m.label)}</text>' for i, m in enumerate(marks) if i % every == 0 or i == n - 1]


def _band(axes: _Axes, marks: list[Mark]) -> list[str]:
    band = [(i, m) for i, m in enumerate(marks) if m.lo is not None and m.hi is not None]
    if not band:
        return []
    upper = " L".join(f"{axes.x(i):.1f},{axes.y(m.hi):.1f}" for i, m in band)
    lower = " L".join(f"{axes.x(i):.1f},{axes.y(m.lo):.1f}" for i, m in reversed(band))
    return [f'<path class="band" d="M{upper} L{lower} Z"><title>min..max tok/s over steps 2..N</title></path>']


def _reference_lines(axes: _Axes, lines: list[tuple[float, str]]) -> list[str]:
    right = WIDTH - RIGHT
    return [f'<line class="ref" x1="{LEFT}" x2="{right}" y1="{axes.y(v):.1f}" y2="{axes.y(v):.1f}"/>'
            f'<text class="refl" x="{right - 4}" y="{axes.y(v) - 4:.1f}" text-anchor="end">{escape(label)}</text>'
            for v, label in lines if math.isfinite(v)]


def _points(axes: _Axes, marks: list[Mark]) -> list[str]:
    """The line through the finite values, then one linked dot each (its title is the tooltip)."""
    out = []
    pts = [(i, m) for i, m in enumerate(marks) if m.y is not None and math.isfinite(m.y)]
    if len(pts) > 1:
        out.append('<polyline class="line" points="' + " ".join(f"{axes.x(i):.1f},{axes.y(m.y):.1f}" for i, m in pts)
                   + '"/>')
    r = 4 if axes.n <= 120 else 3
    for i, m in pts:
        dot = (f'<circle class="pt" cx="{axes.x(i):.1f}" cy="{axes.y(m.y):.1f}" r="{r}" fill="{m.color}">'
               f'<title>{escape(m.tip)}</title></circle>')
        out.append(f'<a href="{escape(m.href)}">{dot}</a>' if m.href else dot)
    return out
