"""One colour language for every figure, static (matplotlib / seaborn) and interactive (plotly).

The rule, in one place (``docs/figures/colour.md`` says it in words; ``check_colours`` tests a figure):

* **Sequential** quantities (a size: shift ratio, share, attention mass, KL, a norm, a distance) use one map,
  ``SEQUENTIAL`` (viridis), where **bright means large** in every figure.
* **Deltas** (ablated - intact) use one diverging map, ``DIVERGING`` (RdBu_r: red = the metric went up, blue =
  down), **centred on zero**: the range is -m..m with m the largest |delta| drawn.
* **The same quantity has the same range** in every panel of a figure and in the static and interactive
  versions: a share, a mass and an hf_ratio are drawn on 0-1; a KL, a shift ratio or a norm on 0 to the largest
  value drawn (over all panels). The one stated exception: single-input attention patterns get one scale per
  head (a figure row), said in the title (``ColourRule.shared`` False).
* **Below the numerical floor is "no effect"**: a value with |v| < ``ColourRule.floor`` is drawn grey
  (``NO_EFFECT``; hatched in static figures), never at full contrast; the colour bar's label states the floor.
  A quantity that cannot be negative (``nonnegative``: a KL) has its tiny negatives from rounding (> -floor)
  drawn as 0; a negative beyond the floor is one ``InputError`` (the table is wrong).

Each colour-mapped artist says which quantity it draws (matplotlib: ``gid`` ``"interp-colour:<quantity>"``;
plotly: ``meta={"quantity": ...}``), so ``check_colours(fig)`` can test any figure against the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap, to_hex, to_rgb

from interp.errors import InputError

__all__ = ["SEQUENTIAL", "DIVERGING", "CATEGORICAL", "NO_EFFECT", "KIND_COLOURS", "ColourRule", "RULES", "rule_for",
           "limits", "drawn_values", "below_floor", "floor_note", "heatmap", "tag", "plotly_scale",
           "plotly_hover_notes", "luminance", "check_colours"]

SEQUENTIAL = "viridis"  # bright = large
DIVERGING = "RdBu_r"  # centred on 0: red = up, blue = down, white = 0
CATEGORICAL = "tab10"  # families, clusters: not a quantity
NO_EFFECT = "#bdbdbd"  # |value| below the quantity's numerical floor
# a bias kind (bars, points) has one colour in every figure: tab10's first four, q blue, k orange, v green, o red
KIND_COLOURS = {kind: to_hex(mpl.colormaps[CATEGORICAL](i)) for i, kind in enumerate("qkvo")}
HATCH = "////"
TAG = "interp-colour:"

# float32 rounding of a metric of size ~1 is ~1e-7 (eps 1.2e-7); a KL between patterns equal up to rounding is
# ~1e-9 (measured: +-8.7e-9 nats for MiniLM without b_k). The floors sit an order of magnitude above.
DELTA_FLOOR = 1e-6
KL_FLOOR = 1e-6
ROUNDING = 1e-6  # a nonnegative quantity without a floor: negatives this small are rounding, drawn as 0


@dataclass(frozen=True)
class ColourRule:
    """How one quantity is coloured.

    ``kind``: "sequential" (bright = large), "diverging" (centred on 0) or "categorical" (not a quantity).
    ``range``: "unit" (0-1, widened only to take in values outside it), "zero_to_max" (0 to the largest value
    drawn), "symmetric" (-m..m, m the largest |value|) or "data" (min to max: a log ratio). ``floor``: values
    with |v| below it are "no effect" (grey); 0: none. ``nonnegative``: >= 0 by definition. ``shared``: one range
    for every panel of the figure (False only where the figure says otherwise)."""

    quantity: str
    kind: str = "sequential"
    range: str = "zero_to_max"
    floor: float = 0.0
    unit: str = ""
    nonnegative: bool = False
    shared: bool = True

    @property
    def cmap(self) -> str:
        return {"sequential": SEQUENTIAL, "diverging": DIVERGING, "categorical": CATEGORICAL}[self.kind]


def _rules(*rules: ColourRule) -> dict[str, ColourRule]:
    return {r.quantity: r for r in rules}


RULES: dict[str, ColourRule] = _rules(
    ColourRule("shift_ratio", range="zero_to_max", unit="content-RMS units", nonnegative=True),
    ColourRule("bias_share", range="unit", nonnegative=True),
    ColourRule("share", range="unit"),  # a covariance share: can fall slightly below 0
    ColourRule("mass", range="unit", nonnegative=True),
    ColourRule("sink_mass", range="unit", nonnegative=True),
    ColourRule("hf_ratio", range="unit", nonnegative=True),
    ColourRule("head_share", range="unit", nonnegative=True),  # share of heads over a threshold (a sink count)
    ColourRule("mean_attention_distance", unit="pixels or tokens", nonnegative=True),
    ColourRule("entropy", unit="nats", nonnegative=True),
    ColourRule("implicit_norm", unit="residual-stream units", nonnegative=True),
    ColourRule("explicit_norm", unit="residual-stream units", nonnegative=True),
    ColourRule("kl", floor=KL_FLOOR, unit="nats", nonnegative=True),
    ColourRule("delta", kind="diverging", range="symmetric", floor=DELTA_FLOOR, unit="metric units"),
    # mass - what uniform attention gives the position (interp.compare): above or below its floor, centred on 0
    ColourRule("sink_mass_over_uniform", kind="diverging", range="symmetric", unit="attention mass above uniform"),
    ColourRule("weight", range="zero_to_max", nonnegative=True, shared=False),  # one scale per head row
    ColourRule("attention_scaled", range="unit", nonnegative=True, shared=False),  # a map over its own max
    ColourRule("log_amplitude", range="data", unit="log amplitude - log DC"),
    ColourRule("cluster", kind="categorical", range="data"),
)


def rule_for(quantity: str, values: Any = None) -> ColourRule:
    """The rule of ``quantity``; a column the library does not know is a delta (diverging, no floor) where its
    ``values`` take both signs, else a size (sequential from 0), so the same column is coloured the same way
    in every figure that draws it."""
    if quantity in RULES:
        return RULES[quantity]
    v = _finite(values)
    if len(v) and v.min() < 0 < v.max():
        return ColourRule(quantity, kind="diverging", range="symmetric")
    return ColourRule(quantity)


def _finite(values: Any) -> np.ndarray:
    if values is None:
        return np.array([])
    v = np.ma.filled(np.ma.asarray(values, dtype=float), np.nan).ravel()
    return v[np.isfinite(v)]


def drawn_values(rule: ColourRule, values: Any) -> np.ndarray:
    """The values as drawn: a ``nonnegative`` quantity's rounding negatives (above -max(floor, ``ROUNDING``))
    become 0; one further below is an ``InputError`` (a KL or a mass cannot be negative: the table is not the
    analyzer's)."""
    v = np.asarray(values, dtype=float)
    if rule.nonnegative:
        bad = np.isfinite(v) & (v < -max(rule.floor, ROUNDING))
        if bad.any():
            raise InputError(f"{rule.quantity} cannot be negative, yet {int(bad.sum())} values are (e.g. "
                             f"{v[bad].ravel()[0]:.3g}, beyond rounding, {max(rule.floor, ROUNDING):g}): draw the "
                             "analyzer's own table")
        v = np.where(np.isfinite(v) & (v < 0), 0.0, v)
    return v


def below_floor(rule: ColourRule, values: Any) -> np.ndarray:
    """Where |value| < the floor (drawn "no effect"); False everywhere for a rule without a floor, and at NaN."""
    v = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        return (np.abs(v) < rule.floor) & np.isfinite(v) if rule.floor > 0 else np.zeros(v.shape, bool)


def limits(rule: ColourRule, values: Any) -> tuple[float, float]:
    """(lo, hi) of the colour scale of ``values`` (every panel's values together: one range per quantity)."""
    v = _finite(drawn_values(rule, values) if values is not None else values)
    lo, hi = (float(v.min()), float(v.max())) if len(v) else (0.0, 1.0)
    if rule.range == "unit":
        return min(0.0, lo), max(1.0, hi)
    if rule.range == "symmetric":
        m = max(abs(lo), abs(hi), 2 * rule.floor) or 1e-12
        return -m, m
    if rule.range == "zero_to_max":
        return min(0.0, lo), max(hi, 2 * rule.floor) if hi > min(0.0, lo) else min(0.0, lo) + 1e-12
    return lo, (hi if hi > lo else lo + 1e-12)


def floor_note(rule: ColourRule) -> str:
    """What the grey means, for a colour bar's label ("" without a floor)."""
    if rule.floor <= 0:
        return ""
    unit = f" {rule.unit}" if rule.unit else ""
    return f"grey: |{rule.quantity}| < {rule.floor:g}{unit} (numerical floor: no effect)"


def tag(artist: Any, quantity: str) -> Any:
    """Say which quantity a matplotlib artist colours (read by ``check_colours``)."""
    artist.set_gid(TAG + quantity)
    return artist


def heatmap(ax: plt.Axes, grid: pd.DataFrame, rule: ColourRule, lo: float, hi: float, *, cbar: bool = True,
            cbar_label: str = "", **kwargs: Any) -> Any:
    """``grid`` (rows x columns) on ``ax`` with seaborn under ``rule``: the map of its kind on (lo, hi), the
    cells below the floor left out of the map and drawn grey and hatched on their own layer (tagged
    ``no_effect``); returns the map's QuadMesh. ``kwargs`` go to ``sns.heatmap`` (annot, fmt, ...)."""
    import seaborn as sns

    values = drawn_values(rule, grid.to_numpy(dtype=float))
    shown = pd.DataFrame(values, index=grid.index, columns=grid.columns)
    quiet = below_floor(rule, values)
    label = "\n".join(x for x in (cbar_label, floor_note(rule) if quiet.any() or rule.floor > 0 else "") if x)
    drawn_before = len(ax.collections)  # the map is the first collection this call adds (ax may hold others)
    sns.heatmap(shown, ax=ax, cmap=mpl.colormaps[rule.cmap], vmin=lo, vmax=hi, mask=quiet | ~np.isfinite(values),
                cbar=cbar, cbar_kws={"label": label} if cbar else None, **kwargs)
    mesh = tag(ax.collections[drawn_before], rule.quantity)
    if quiet.any():
        layer = ax.pcolor(np.arange(values.shape[1] + 1), np.arange(values.shape[0] + 1),
                          np.ma.masked_array(np.zeros(values.shape), ~quiet), cmap=ListedColormap([NO_EFFECT]), vmin=0,
                          vmax=1, hatch=HATCH, edgecolor="#8c8c8c", linewidth=0.0)  # pcolor: hatching is drawn
        tag(layer, "no_effect")
    return mesh


# ----- plotly -----------------------------------------------------------------------------------------------


def _rgb(colour: Any) -> str:
    r, g, b = (round(255 * c) for c in to_rgb(colour))
    return f"rgb({r},{g},{b})"


def _stops(cmap: str, n: int = 11) -> list[tuple[float, str]]:
    m = mpl.colormaps[cmap]
    return [(i / (n - 1), _rgb(m(i / (n - 1)))) for i in range(n)]


def plotly_colorscale(rule: ColourRule, lo: float, hi: float) -> list[list]:
    """The rule's map as a plotly colour scale on (lo, hi), sampled from the same matplotlib map as the static
    figures, with the band of |v| < floor grey (a sharp step: plotly interpolates between stops exactly)."""
    stops = _stops(rule.cmap)
    if rule.floor <= 0 or hi <= lo:
        return [list(s) for s in stops]
    a = float(np.clip((-rule.floor - lo) / (hi - lo), 0, 1))
    b = float(np.clip((rule.floor - lo) / (hi - lo), 0, 1))
    m = mpl.colormaps[rule.cmap]
    out = [list(s) for s in stops if s[0] < a]
    if a > 0:
        out.append([a, _rgb(m(a))])
    out += [[a, NO_EFFECT_RGB], [b, NO_EFFECT_RGB]]
    if b < 1:
        out.append([b, _rgb(m(b))])
    out += [list(s) for s in stops if s[0] > b]
    if out[0][0] != 0:
        out.insert(0, [0.0, out[0][1]])
    if out[-1][0] != 1:
        out.append([1.0, out[-1][1]])
    return out


NO_EFFECT_RGB = _rgb(NO_EFFECT)


def plotly_scale(rule: ColourRule, lo: float, hi: float) -> dict:
    """The keyword arguments of a plotly trace coloured by ``rule`` on (lo, hi)."""
    return dict(colorscale=plotly_colorscale(rule, lo, hi), zmin=lo, zmax=hi, meta={"quantity": rule.quantity})


def plotly_hover_notes(rule: ColourRule, values: Any) -> np.ndarray:
    """Per cell, what the hover adds after the value: the floor for the cells below it, else ""."""
    v = np.asarray(values, dtype=float)
    unit = f" {rule.unit}" if rule.unit else ""
    return np.where(below_floor(rule, v), f" (below the numerical floor {rule.floor:g}{unit}: no effect)", "")


# ----- the check ---------------------------------------------------------------------------------------------


def luminance(rgb: Sequence[float]) -> float:
    """Relative luminance (Rec. 709 weights) of an RGB(A) colour on 0-1: what "bright" means in the rule."""
    r, g, b = rgb[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _close(a: Sequence[float], b: Sequence[float], tol: float = 0.02) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a[:3], b[:3]))


def _colour_at(scale: list, x: float) -> tuple[float, float, float]:
    """The colour of a plotly colour scale at x in [0, 1] (linear between stops, as plotly draws it)."""
    pos = [float(p) for p, _ in scale]
    cols = [np.array(to_rgb(_parse(c))) for _, c in scale]
    x = min(max(x, 0.0), 1.0)
    for i in range(len(pos) - 1):
        if pos[i] <= x <= pos[i + 1]:
            if x == pos[i + 1] and i + 2 < len(pos) and pos[i + 1] == pos[i + 2]:
                continue  # a sharp step: the value at the step belongs to the next band
            t = 0.0 if pos[i + 1] == pos[i] else (x - pos[i]) / (pos[i + 1] - pos[i])
            return tuple((1 - t) * cols[i] + t * cols[i + 1])
    return tuple(cols[-1])


def _parse(colour: str) -> Any:
    colour = str(colour).strip()
    if colour.startswith("rgb"):
        return tuple(float(x) / 255 for x in colour[colour.index("(") + 1:-1].split(",")[:3])
    return colour


class _Drawn:
    """One colour-mapped thing in a figure: its quantity tag, values (masked where not drawn in colour), the
    colours of its two ends and a function giving the colour of a value."""

    def __init__(self, where: str, quantity: Optional[str], values: np.ndarray, lo: float, hi: float,
                 colour_of: Any, ends: tuple):
        self.where, self.quantity, self.values, self.lo, self.hi = where, quantity, values, lo, hi
        self.colour_of, self.ends = colour_of, ends


def _drawn_mpl(fig: Any) -> list[_Drawn]:
    out = []
    for i, ax in enumerate(fig.axes):
        if ax.get_label() == "<colorbar>":
            continue
        for artist in list(ax.collections) + list(ax.images):
            array = artist.get_array() if hasattr(artist, "get_array") else None
            if array is None or getattr(array, "ndim", 0) == 3 or not hasattr(artist, "cmap"):
                continue  # not colour-mapped (fixed colours, an RGB image)
            gid = artist.get_gid() or ""
            quantity = gid[len(TAG):] if gid.startswith(TAG) else None
            norm, cmap = artist.norm, artist.cmap
            lo, hi = float(norm.vmin), float(norm.vmax)
            out.append(_Drawn(f"axes {i} ({ax.get_title()[:40]!r}) {type(artist).__name__}", quantity,
                              np.ma.asarray(array, dtype=float), lo, hi,
                              lambda v, n=norm, c=cmap: c(float(n(v))), (cmap(0.0), cmap(1.0))))
    return out


def _drawn_plotly(fig: Any) -> list[_Drawn]:
    out = []
    for i, trace in enumerate(fig.data):
        scale = getattr(trace, "colorscale", None)
        z = getattr(trace, "z", None)
        if scale is None or z is None or trace.type == "image":
            continue
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        values = np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)
        lo = float(trace.zmin) if trace.zmin is not None else float(np.nanmin(values))
        hi = float(trace.zmax) if trace.zmax is not None else float(np.nanmax(values))
        scale = [list(s) for s in scale]

        def colour_of(v, s=scale, a=lo, b=hi):
            return _colour_at(s, (v - a) / (b - a) if b > a else 0.0)

        out.append(_Drawn(f"trace {i} ({trace.name or ''})", meta.get("quantity"),
                          np.ma.masked_invalid(values), lo, hi, colour_of,
                          (_colour_at(scale, 0.0), _colour_at(scale, 1.0))))
    return out


def check_colours(fig: Any) -> list[str]:
    """What in ``fig`` (a matplotlib or plotly figure) breaks the colour rule; [] when nothing does.

    Every colour-mapped artist must state its quantity; its map must be the one of the quantity's kind
    (compared by the colours of its ends: a viridis delta map fails), bright = large for a sequential map,
    centred on 0 for a diverging one; its range as the rule says (0-1 for a share, from 0 for a size) and one
    range per quantity in the figure (where ``shared``); and no value below the floor drawn in a colour other
    than ``NO_EFFECT`` (a noise panel at full contrast fails)."""
    drawn = _drawn_plotly(fig) if hasattr(fig, "to_plotly_json") else _drawn_mpl(fig)
    problems: list[str] = []
    ranges: dict[str, set] = {}
    for d in drawn:
        if d.quantity is None:
            problems.append(f"{d.where}: colour-mapped without saying its quantity (tag it)")
            continue
        if d.quantity == "no_effect":
            if not all(_close(d.colour_of(v), to_rgb(NO_EFFECT)) for v in _finite(d.values)):
                problems.append(f"{d.where}: the no-effect layer is not {NO_EFFECT}")
            continue
        rule = rule_for(d.quantity, d.values)
        m = mpl.colormaps[rule.cmap]
        grey = to_rgb(NO_EFFECT)
        lo_end, hi_end = d.ends
        want_lo, want_hi = m(0.0), m(1.0)
        if rule.kind == "categorical":
            palette = [to_rgb(c) for c in mpl.colormaps[CATEGORICAL].colors]
            if not all(any(_close(d.colour_of(v), c) for c in palette) for v in _finite(d.values)):
                problems.append(f"{d.where}: {d.quantity} is categorical and must take its colours from {CATEGORICAL}")
            continue
        if not (_close(lo_end, want_lo) or _close(lo_end, grey)) or not _close(hi_end, want_hi):
            problems.append(f"{d.where}: {d.quantity} is {rule.kind} and must use {rule.cmap}; its map runs "
                            f"{to_hex(lo_end[:3])} -> {to_hex(hi_end[:3])}")
        if rule.kind == "sequential" and luminance(hi_end) <= luminance(want_lo):
            problems.append(f"{d.where}: {d.quantity}'s map is dark at its large end (bright must mean large)")
        if rule.kind == "diverging" and not np.isclose(d.lo, -d.hi, rtol=1e-9, atol=1e-15):
            problems.append(f"{d.where}: delta map not centred on 0 ({d.lo:.3g}..{d.hi:.3g})")
        if rule.range == "unit" and (d.lo > 0 or d.hi < 1):
            problems.append(f"{d.where}: {d.quantity} is drawn on {d.lo:.3g}..{d.hi:.3g}, not on 0-1")
        if rule.range == "zero_to_max" and rule.nonnegative and d.lo != 0:
            problems.append(f"{d.where}: {d.quantity} cannot be negative; its scale must start at 0, not {d.lo:.3g}")
        if rule.shared:
            ranges.setdefault(d.quantity, set()).add((round(d.lo, 12), round(d.hi, 12)))
        values = _finite(d.values)
        if rule.nonnegative and len(values) and values.min() < 0:
            problems.append(f"{d.where}: {d.quantity} drawn negative ({values.min():.3g}); it is >= 0")
        noisy = values[below_floor(rule, values)]
        loud = [v for v in noisy if not _close(d.colour_of(v), grey)]
        if loud:
            problems.append(f"{d.where}: {len(loud)} values of {d.quantity} below its floor {rule.floor:g} (e.g. "
                            f"{loud[0]:.2g}) drawn in colour, not as no effect")
    for quantity, spans in ranges.items():
        if len(spans) > 1:
            problems.append(f"{quantity} is drawn on {len(spans)} ranges in one figure ({sorted(spans)}): one "
                            "quantity, one range")
    return problems

