"""``interp single-input``: one image or prompt looked at closely (``interp.single_input``), as a Section of
tables and figures for an output folder.

Tables (long-form, as ``single_input`` returns them): ``single_input_patterns`` (each head's pattern
intact and without b_q, b_k, b_v or the key prior), ``single_input_heads`` (per head and condition: the
largest pattern change, mean KL(intact || without) in nats, the output change without b_v),
``single_input_key_prior`` (the keys u = W_k b_q favours), ``single_input_positions``. Figures: the
patterns of the heads the key prior (else b_q) changes most, the key prior's favoured keys, and for a
ViT the attention maps over the image, intact and without b_q (at most ``OVERLAY_LAYERS`` layers).
"""

from __future__ import annotations

from typing import Any, Optional

from interp.analysis.single_input import SingleInput, single_input
from interp.models.bridge import InterpBridge
from interp.report.sections import Section
from interp.figures.single_input_plots import key_prior_top_tokens, single_input_overlay, single_input_patterns

OVERLAY_LAYERS = 4  # a ViT's overlays: this many layers, evenly spaced, of those analysed


def _overlay_layers(layers: list[int], n: int = OVERLAY_LAYERS) -> list[int]:
    """At most ``n`` of ``layers``, evenly spaced, first and last included."""
    if len(layers) <= n:
        return list(layers)
    return sorted({layers[round(i * (len(layers) - 1) / (n - 1))] for i in range(n)})


def _largest(view: SingleInput) -> dict[str, dict[str, Any]]:
    """Per removed bias (condition), the head whose pattern changes most (mean KL) and the largest pattern
    change of any head."""
    heads, found = view.heads, {}
    for cond, rows in heads[heads.condition != "intact"].groupby("condition", observed=True):
        top = rows.loc[rows.kl.idxmax()] if rows.kl.notna().any() else rows.iloc[0]
        found[str(cond)] = dict(layer=int(top.layer), head=int(top["head"]), kl=float(top.kl),
                                max_abs_diff=float(rows.max_abs_diff.max()))
    return found


def _single_input_text(view: SingleInput, what: str) -> str:
    """What the tables say, in a few sentences (the numbers are ``_largest``'s)."""
    m, largest = view.meta, _largest(view)
    parts = [f"{what} ({m['n_positions']} positions) on {m['model']}, layers {m['layers']}, query {m['query']!r}."]
    identities = {"no_b_v": "v is not in the score"} | ({"no_b_k": "b_k cancels in the softmax"}
                                                          if m.get("k_bias_inert") else {})
    for cond, top in largest.items():
        why = f" (an identity, {identities[cond]}: rounding only)" if cond in identities else ""
        parts.append(f"{cond}: largest mean KL {top['kl']:.3g} nats (layer {top['layer']}, head {top['head']}); "
                     f"the pattern moves by at most {top['max_abs_diff']:.3g}{why}.")
    if not view.key_prior.empty:
        first = view.key_prior[view.key_prior["rank"] == 1].nlargest(1, "key_prior_centered")
        parts.append(f"The key prior favours {str(first.label.iloc[0]).strip()!r} most (layer "
                     f"{int(first.layer.iloc[0])}, head {int(first['head'].iloc[0])}).")
    parts.extend(m.get("notes", []))
    return " ".join(parts)


def single_input_section(model: InterpBridge, item: Any, *, what: str = "one input", layers: Any = None,
                      heads: Any = None, query: Any = None, top_k: Optional[int] = 10,
                      float64: bool = False) -> tuple[SingleInput, Section]:
    """``single_input(model, item, ...)`` and the Section of its tables and figures (module doc)."""
    view = single_input(model, item, layers=layers, heads=heads, query=query, top_k=top_k, float64=float64)
    figures = {"single_input_patterns": single_input_patterns(view)}
    if not view.key_prior.empty:
        figures["single_input_key_prior"] = key_prior_top_tokens(view)
    if view.image is not None:
        shown = _overlay_layers(list(view.meta["layers"]))
        figures["single_input_overlay"] = single_input_overlay(view, layers=shown)
        if (view.patterns.condition == "no_b_q").any():
            figures["single_input_overlay_no_b_q"] = single_input_overlay(view, condition="no_b_q", layers=shown)
    tables = {"single_input_patterns": view.patterns, "single_input_heads": view.heads,
              "single_input_key_prior": view.key_prior, "single_input_positions": view.positions}
    numbers = dict(query=view.meta["query"], n_positions=view.meta["n_positions"], layers=view.meta["layers"],
                   largest=_largest(view))
    section = Section("single_input", "One input, closely", _single_input_text(view, what), numbers, tables=tables,
                      figures=figures, shown=list(figures))
    return view, section
