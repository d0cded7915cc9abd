"""Measuring one arm of the sink experiment on held-out inputs: per head and per layer.

Two ways, one schema. ``direct_tables`` reads the attention weights the model returns (for a slot
arm, ``slot_attention``'s, with the slot in column 0) and forward hooks on v_proj and on every
block's output; it sees everything (slot, registers, the first text token after a sink token).
``analyzer_tables`` runs ``interp.analysis.sinks`` (``sink_profile``, ``implicit_value_bias``,
``massive_activations``) through the bridge, which sees what plain HF models have (the first
token or CLS, explicit b_v) but not a slot or registers. ``measure`` takes the analyzer's numbers
where the bridge can run the arm, the direct ones for the rest, and records how far the two
disagree on what both measure (``analyzer_vs_direct``; tests hold it near rounding).

With A[b, h, i, j] the attention of query i to key j (rows sum to 1, slot included), the means
over the query rows i of the probe (b, i) other than the class's own positions (the query row at a
sink position itself is left out: under the causal mask the first position's row can attend only to
itself, and to the slot, so without a slot its mass there is 1 by construction; the slot has no row):

    mass_c[l, h]        = mean_{b, i not in S_c} sum_{j in S_c} A[b, h, i, j]
    uniform_c           = mean_{i not in S_c} |S_c & K_i| / |K_i|      (K_i: the keys row i may attend,
                                                                        slot included; the floor of mass_c)
    c_i                 = sum_{j in S} A_ij v_j W_O[h]                 (S: the first position)
    implicit_norm       = ||mean_i c_i||,   constancy = ||mean_i c_i||^2 / mean_i ||c_i||^2
    slot_norm           = ||mean_i A_i* v* W_O[h]||                    (the slot's learned constant)
    explicit_norm       = ||b_v W_O[h]||
    max_over_median[l]  = max_{b,i,c} |h_l[b,i,c]| / median_{b,i,c} |h_l[b,i,c]|   (h_l: after block l)

Position classes: ``first`` = position 0 of the input (the sink token in arm ``sink_token``, CLS in
vision), ``first_text`` = the first byte of text (position 1 after a sink token, else 0),
``slot`` = the slot, ``registers`` = the 4 register tokens together.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from interp.analysis.sinks import (
    NEAR_BAND, SINK_THRESHOLD, implicit_value_bias, massive_activations, sink_profile,
)
from interp.models.loading import load_model
from experiments.training.sink_arms import N_REGISTERS, attention_modules, has_slot, n_prefix

BRIDGEABLE = {("text", "none"), ("text", "qkv"), ("text", "sink_token"), ("vision", "none"), ("vision", "qkv")}
CLASSES = ("first", "first_text", "slot", "registers")
HEAD_COLUMNS = ["layer", "head", "mass_first", "mass_first_text", "mass_slot", "mass_registers", "implicit_norm",
                "constancy", "slot_norm", "explicit_norm", "output_rms", "uniform_first", "uniform_first_text",
                "uniform_slot", "uniform_registers"]
LAYER_COLUMNS = ["layer", "max_abs", "median_abs", "max_over_median"]


def _blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers) if hasattr(model, "model") else list(model.vit.layers)


def _forward_with_captures(model: nn.Module, inputs: Tensor, domain: str) -> tuple[Any, list, list]:
    """(output with attentions, block outputs, v_proj outputs) of one forward."""
    outs, values, hooks = [], [], []
    for block in _blocks(model):
        hooks.append(block.register_forward_hook(lambda m, i, o: outs.append(o[0] if isinstance(o, tuple) else o)))
    for attn in attention_modules(model):
        hooks.append(attn.v_proj.register_forward_hook(lambda m, i, o: values.append(o)))
    try:
        with torch.no_grad():
            key = "input_ids" if domain == "text" else "pixel_values"
            out = model(**{key: inputs}, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    return out, outs, values


def visible_keys(n_query: int, slot: int, causal: bool) -> Tensor:
    """Bool [query, slot + key]: the keys each query row may attend (the slot, in column 0, by every row)."""
    keys = torch.ones(n_query, slot + n_query, dtype=torch.bool)
    if causal:
        keys[:, slot:] = torch.ones(n_query, n_query, dtype=torch.bool).tril()
    return keys


def class_mass(a: Tensor, cols: list[int], slot: int, causal: bool) -> tuple[Tensor, float]:
    """(mass [head], uniform floor) of the key columns ``cols`` of a [b, h, query, slot + key] (module
    doc): over the query rows other than the class's own (column c >= slot is row c - slot's key)."""
    own = [c - slot for c in cols if c >= slot]
    rows = torch.ones(a.shape[2], dtype=torch.bool)
    rows[own] = False
    keys = visible_keys(a.shape[2], slot, causal).double()
    uniform = keys[:, cols].sum(-1) / keys.sum(-1)
    return a[..., cols].sum(-1)[..., rows].mean((0, 2)), float(uniform[rows].mean())


def uniform_floor(n_query: int, cols: list[int], slot: int, causal: bool) -> float:
    """The floor of ``class_mass`` for ``n_query`` query rows (``class_mass``'s uniform part alone)."""
    keys = torch.ones(1, 1, n_query, slot + n_query, dtype=torch.float64)
    return class_mass(keys, cols, slot, causal)[1]


def drop_own_rows(with_self: pd.Series, n_rows: int, n_own: int,
                  own_sum: Optional[float] = None) -> tuple[pd.Series, pd.Series, pd.Series]:
    """A mass measured over every one of ``n_rows`` query rows (before the own row was left out), re-expressed over the
    rows other than the class's ``n_own`` own rows: (mass, low, high). With ``own_sum`` (what the own
    rows put on the class, known by construction: 1 per row for the first position under a causal
    mask without a slot) mass = (n_rows m - own_sum) / (n_rows - n_own), exactly, and low = high = mass;
    without it mass is NaN and [low, high] = [(n_rows m - n_own) / (n_rows - n_own), n_rows m /
    (n_rows - n_own)] clipped to [0, 1] (each own row puts between 0 and 1 there)."""
    if n_own == 0:
        return with_self, with_self, with_self
    rest = n_rows - n_own
    if own_sum is not None:
        exact = (with_self * n_rows - own_sum) / rest
        return exact, exact, exact
    low, high = ((with_self * n_rows - n_own) / rest).clip(lower=0), (with_self * n_rows / rest).clip(upper=1)
    return pd.Series(np.nan, index=with_self.index), low, high


def _head_rows(model: nn.Module, out: Any, values: list, domain: str, arm: str) -> list[dict]:
    slot, prefix = int(has_slot(model)), n_prefix(domain, arm)
    rows = []
    for layer, (attn, a, v) in enumerate(zip(attention_modules(model), out.attentions, values)):
        a = a.double()
        n_heads, d_head = a.shape[1], v.shape[-1] // a.shape[1]
        v = v.double().unflatten(-1, (n_heads, d_head))  # [b, pos, h, d]
        W_o = attn.o_proj.weight.double().T.reshape(n_heads, d_head, -1)  # [h, d, model]
        first_text = slot + (prefix if domain == "text" else 0)
        masses = {"first": [slot], "first_text": [first_text], "slot": [0] if slot else None,
                  "registers": list(range(1, 1 + N_REGISTERS)) if arm == "registers" else None}
        masses = {k: class_mass(a, c, slot, domain == "text") if c else (None, np.nan) for k, c in masses.items()}
        c = torch.einsum("bhq,bhd,hdm->bhqm", a[..., slot], v[:, 0], W_o)  # S = the first position
        z = torch.einsum("bhqk,bkhd->bqhd", a[..., slot:], v)
        if slot:
            z = z + torch.einsum("bhq,hd->bqhd", a[..., 0], attn.slot_value.double())
        o_rms = torch.einsum("bqhd,hdm->bhqm", z, W_o).pow(2).sum(-1).mean((0, 2)).sqrt()
        m = c.mean((0, 2))
        constancy = m.pow(2).sum(-1) / c.pow(2).sum(-1).mean((0, 2))
        b_v = attn.v_proj.bias
        explicit = torch.einsum("hd,hdm->hm", b_v.double().view(n_heads, d_head), W_o).norm(dim=-1) \
            if b_v is not None else torch.zeros(n_heads, dtype=torch.float64)
        slot_norm = torch.einsum("bhq,hd,hdm->hm", a[..., 0], attn.slot_value.double(), W_o).div(
            a.shape[0] * a.shape[2]).norm(dim=-1) if slot else torch.full((n_heads,), np.nan)
        cols = {**{f"mass_{k}": t for k, (t, _) in masses.items()},
                "implicit_norm": m.norm(dim=-1), "constancy": constancy, "slot_norm": slot_norm,
                "explicit_norm": explicit, "output_rms": o_rms}
        floors = {f"uniform_{k}": u for k, (_, u) in masses.items()}
        for h in range(n_heads):
            values = {k: np.nan if t is None else float(t[h].detach()) for k, t in cols.items()}
            rows.append(dict(layer=layer, head=h, **values, **floors))
    return rows


def direct_tables(model: nn.Module, inputs: Tensor, domain: str, arm: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(heads, layers) of the module doc from one forward over ``inputs`` (token ids [b, pos], the
    sink token already prepended, or pixels [b, 3, H, W])."""
    model.eval()
    out, outs, values = _forward_with_captures(model, inputs, domain)
    heads = pd.DataFrame(_head_rows(model, out, values, domain, arm), columns=HEAD_COLUMNS)
    layers = []
    for layer, h in enumerate(outs):
        absval = h.detach().abs().flatten()
        median = float(absval.median())  # the lower median, as the analyzer's
        layers.append(dict(layer=layer, max_abs=float(absval.max()), median_abs=median,
                           max_over_median=float(absval.max()) / median))
    return heads, pd.DataFrame(layers, columns=LAYER_COLUMNS)


def analyzer_tables(model: nn.Module, inputs: Tensor, domain: str, batch: int = 16) -> tuple[pd.DataFrame,
                                                                                              pd.DataFrame]:
    """The same tables' ``mass_first``, ``implicit_norm``, ``constancy``, ``explicit_norm``,
    ``output_rms`` and layer columns from ``interp.analysis.sinks`` over the bridge (plain HF arms only)."""
    bridge = load_model(copy.deepcopy(model).eval())  # load_model wraps in place: the trained model stays bare
    data = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    first = "first" if domain == "text" else "cls"
    kw = dict(progress=False)
    profile = sink_profile(bridge, data, positions=[first], **kw)
    value = implicit_value_bias(bridge, data, positions=[first], **kw)
    massive = massive_activations(bridge, data, top_k=1, **kw)
    heads = profile[["layer", "head", "mass"]].rename(columns={"mass": "mass_first"}).merge(
        value[["layer", "head", "implicit_norm", "constancy", "explicit_norm", "output_rms"]], on=["layer", "head"])
    layers = massive[["layer", "abs_value", "median_abs", "ratio_to_median"]].rename(
        columns={"abs_value": "max_abs", "ratio_to_median": "max_over_median"})
    return heads, layers


def _relative_gap(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> float:
    x, y = a[columns].to_numpy(float), b[columns].to_numpy(float)
    return float(np.nanmax(np.abs(x - y) / np.maximum(np.abs(y), 1e-6)))


def measure(model: nn.Module, inputs: Tensor, domain: str, arm: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(heads, layers, summary) of one arm on ``inputs``: the analyzer's numbers where the bridge runs
    the arm, else the direct ones (module doc). Summary: per class, Gu et al.'s shares (mass >
    ``SINK_THRESHOLD``), ``sink_near_<c>`` (heads within ``NEAR_BAND`` of it), mean masses and the
    floor ``uniform_<c>``; the largest max_over_median over layers, the head means of implicit_norm,
    explicit_norm and slot_norm, ``measured_by``, ``analyzer_vs_direct``."""
    heads, layers = direct_tables(model, inputs, domain, arm)
    by, gap = "direct", np.nan
    if (domain, arm) in BRIDGEABLE:
        a_heads, a_layers = analyzer_tables(model, inputs, domain)
        shared_h = ["mass_first", "implicit_norm", "constancy", "explicit_norm", "output_rms"]
        shared_l = ["max_abs", "median_abs", "max_over_median"]
        gap = max(_relative_gap(heads, a_heads, shared_h), _relative_gap(layers, a_layers, shared_l))
        heads[shared_h], layers[shared_l] = a_heads[shared_h].to_numpy(), a_layers[shared_l].to_numpy()
        by = "analyzer"
    summary = dict(measured_by=by, analyzer_vs_direct=gap, max_over_median=float(layers.max_over_median.max()),
                   implicit_norm=float(heads.implicit_norm.mean()), explicit_norm=float(heads.explicit_norm.mean()),
                   slot_norm=float(heads.slot_norm.mean()))
    for cls in ("first", "first_text", "slot", "registers"):
        col = heads[f"mass_{cls}"]
        known = col.notna().all()
        summary[f"sink_share_{cls}"] = float((col > SINK_THRESHOLD).mean()) if known else np.nan
        summary[f"sink_near_{cls}"] = float(((col - SINK_THRESHOLD).abs() <= NEAR_BAND).sum()) if known else np.nan
        summary[f"mean_mass_{cls}"] = float(col.mean()) if known else np.nan
        summary[f"uniform_{cls}"] = float(heads[f"uniform_{cls}"].iloc[0])
    return heads, layers, summary
