"""Where each head's bias moves its origin: ``origin_shift``.

For head h and kind c in {q, k, v}, with X the attention input (after the layer norm):

    content      XW          data-induced origin   o_data = E[X] W = E[XW]
    bias         b           total origin          o      = E[XW + b] = o_data + b
    shift_ratio  = ||b|| / sqrt(E ||XW||^2)          (how far the bias moves the head,
                                                      in units of the content's RMS)
    bias_share   = ||b|| / (||b|| + ||o_data||)      (0: the data sets the origin alone;
                                                      1: the bias does; 0 when no bias)
    cos_bias_data_origin = cos(b, o_data)

For q also the key prior u = W_k b_q (in residual space; the only route by which b_q
changes the pattern, see ``score_decomposition``): its norm and cosines with the mean
attention input E[X], the CLS token and (max |cos| over positions) the position
embeddings, where the model has them.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from interp.analysis.origin_intervals import origin_intervals
from interp.bootstrap import check_bootstrap
from interp.checks import check_heads, check_layers
from interp.errors import InputError, public
from interp.record.heads import attention_weights, kv_group
from interp.models.bridge import InterpBridge, require_bridge
from interp.record.stats import QKVStats, require_stats


def _cos(a: Tensor, b: Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return float("nan")
    return float(torch.dot(a.flatten(), b.flatten()) / (na * nb))


def _embedding_directions(model: InterpBridge) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """(CLS token [d_model] or None, learned position embeddings [n_pos, d_model] or None).

    Read from the modules' attributes (``cls_token`` / CLIP's ``class_embedding``;
    ``position_embeddings``, ``position_embedding``, ``wpe``, ``embed_positions``, timm's
    ``pos_embed``, open_clip's ``positional_embedding``), not from parameter names, which the
    bridge rewrites.
    """
    cls, pos = None, None
    for module in model.hf_model.modules():
        for attr in ("cls_token", "class_embedding"):
            token = getattr(module, attr, None)
            if isinstance(token, nn.Parameter) and cls is None:
                cls = token.detach().reshape(-1).double()
        for attr in ("position_embeddings", "position_embedding", "wpe", "embed_positions", "pos_embed",
                     "positional_embedding"):  # HF, timm, open_clip
            table = getattr(module, attr, None)
            table = getattr(table, "original_component", table)  # the bridge wraps some embeddings
            if isinstance(table, nn.Embedding):
                table = table.weight
            if isinstance(table, nn.Parameter) and pos is None:
                pos = table.detach().reshape(-1, table.shape[-1]).double()
    return cls, pos


def _recorded_layers(stats: QKVStats, layers: Any, info: Any) -> list[int]:
    """The selected layers (None: every recorded one); a layer the statistics lack is refused."""
    if layers is None:
        return list(stats.layers)
    chosen = check_layers(layers, info)
    missing = [layer for layer in chosen if layer not in stats.layers]
    if missing:
        raise InputError(f"layers {missing} were not recorded (the statistics hold layers {list(stats.layers)}): "
                         "record them (record_qkv(..., layers=...)) or leave them out of layers=")
    return chosen


@public
def origin_shift(model: InterpBridge, stats: QKVStats, *, layers: Any = None, heads: Any = None, data: Any = None,
                 max_batches: Optional[int] = None, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per layer x head x kind: how the bias shifts the head's origin (see module doc).

    ``layers`` / ``heads`` (None: all): only those rows, equal to the same rows of the full table.
    shift_ratio_lo / shift_ratio_hi and bias_share_lo / bias_share_hi: 95% percentile bootstrap over
    items (``n_boot`` resamples fixed by ``seed``). The statistics keep no per-item data, so the
    intervals need the ``data`` (and ``max_batches``) they were recorded on, passed again: one more pass
    keeps per-item sums (``interp.analysis.origin_intervals``). Without ``data`` the data ``record_qkv`` read is
    used when the statistics kept it (in memory and readable again: ``QKVStats.recorded_data``), with their
    ``max_batches``; otherwise (a file, folder or stream recorded, statistics loaded or merged, ``n_boot=0``) these
    columns are NaN. ``interval_note`` says per row which data gave the intervals, or why there are none."""
    info = require_bridge(model, "origin_shift").interp
    stats = require_stats(stats).require_model(model)
    layers, heads = _recorded_layers(stats, layers, info), check_heads(heads, info)
    boot = check_bootstrap(n_boot, seed)
    cls, pos = _embedding_directions(model)
    group = kv_group(info.n_heads, info.n_kv_heads)
    rows = []
    for layer in layers:
        w = attention_weights(model, layer, dtype=torch.float64)
        x_mean = stats.input_mean(layer).cpu()
        for kind in stats.kinds:
            b = w.bias(kind).cpu()
            data_origin = stats.mean(layer, kind, "content").cpu()
            total = stats.mean(layer, kind, "full").cpu()
            msq_content = stats.mean_sq_norm(layer, kind, "content").cpu()
            for h in (h for h in heads if h < b.shape[0]):
                bn, dn = float(b[h].norm()), float(data_origin[h].norm())
                rms = math.sqrt(max(float(msq_content[h]), 0.0))
                row = dict(
                    layer=layer, head=h, kind=kind, present=bool(w.present[kind]),
                    bias_norm=bn, content_rms=rms,
                    shift_ratio=bn / rms if rms > 0 else float("nan"),
                    data_origin_norm=dn, total_origin_norm=float(total[h].norm()),
                    bias_share=bn / (bn + dn) if (bn + dn) > 0 else 0.0,
                    cos_bias_data_origin=_cos(b[h], data_origin[h]),
                    key_prior_norm=np.nan, cos_key_prior_mean_input=np.nan,
                    cos_key_prior_cls=np.nan, max_abs_cos_key_prior_pos=np.nan,
                )
                if kind == "q":
                    u = w.W_K[group[h]].cpu() @ b[h]  # [d_model]
                    row["key_prior_norm"] = float(u.norm())
                    row["cos_key_prior_mean_input"] = _cos(u, x_mean)
                    if cls is not None:
                        row["cos_key_prior_cls"] = _cos(u, cls.cpu())
                    if pos is not None and float(u.norm()) > 0:
                        p = pos.cpu()
                        cosines = (p @ u) / (p.norm(dim=-1).clamp(min=1e-30) * u.norm())
                        row["max_abs_cos_key_prior_pos"] = float(cosines.abs().max())
                rows.append(row)
    return _with_intervals(pd.DataFrame(rows), model, stats, data, layers, boot, max_batches)


NO_DATA_NOTE = ("no intervals: the statistics keep no per-item sums and no data to read again (recorded from a file, "
                "folder or stream, loaded or merged): pass data= (the data they were recorded on)")


def _with_intervals(table: pd.DataFrame, model: InterpBridge, stats: QKVStats, data: Any, layers: list[int],
                    boot: tuple[int, int], max_batches: Optional[int]) -> pd.DataFrame:
    """The interval columns and ``interval_note``: from ``data``, else from the data ``record_qkv`` kept, else NaN
    with the reason (a kept list changed since the recording is a reason too, never an error)."""
    columns = ("shift_ratio_lo", "shift_ratio_hi", "bias_share_lo", "bias_share_hi")
    note = f"95% bootstrap over items, {boot[0]} resamples, of the data passed (data=)"
    if data is None and stats.recorded_data is not None:
        data, max_batches = stats.recorded_data
        note = f"95% bootstrap over items, {boot[0]} resamples, of the data record_qkv read (kept with the statistics)"
        try:
            bounds = None if boot[0] == 0 or table.empty else origin_intervals(model, stats, data, layers, boot,
                                                                                max_batches)
        except InputError as exc:
            return table.assign(**{c: np.nan for c in columns}, interval_note=f"no intervals: {exc}")
    elif data is None or boot[0] == 0 or table.empty:
        bounds = None
    else:
        bounds = origin_intervals(model, stats, data, layers, boot, max_batches)
    if bounds is None:
        why = "no intervals: n_boot=0" if boot[0] == 0 else NO_DATA_NOTE
        return table.assign(**{c: np.nan for c in columns}, interval_note=why)
    return table.assign(**{c: [float(bounds[(r.layer, r.kind)][c][r.head]) for r in table.itertuples()]
                           for c in columns}, interval_note=note)
