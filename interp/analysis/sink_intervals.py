"""The share of sink heads with a bootstrap interval over items (texts or images).

``sink_profile`` averages each head's attention mass over every real query row of the data, so its
share of sink heads is one number with no spread. Here each item's profile is kept apart
(``sink_profiles_by_item``: each item's own ``sink_profile``, keyed by a hash of the item's real tokens or
pixels, ``interp.bootstrap.item_keys``), and the share is recomputed on resamples of the items. With
r_th the query rows of item t that count for head h (``n_query_rows`` where the profile has it, else
``n_rows``) and v_th the item's per-row mean of ``value`` (``mass`` by default), a resample b that draws
item t w_bt times gives

    v_bh    = sum_t w_bt r_th v_th / sum_t w_bt r_th          (the pooled mean: what sink_profile gives
                                                               on the resampled items)
    share_b = (1/H) sum_h [v_bh > threshold]

``share`` is the same with every w = 1 (sink_profile's share over all the items), ``share_lo`` /
``share_hi`` the 2.5th / 97.5th percentiles of share_b (``interp.bootstrap``: n_boot resamples fixed by
``seed``, items in the canonical order of their keys, so the interval does not depend on batching).
``sink_share_difference`` compares two tables (two models): diff_b = share_b(first) - share_b(second) over
independent resamples of each table's items, and its percentile interval.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd


from interp.analysis.sink_parts import SINK_THRESHOLD, check_threshold, stream_batches
from interp.analysis.sinks import _profile_part
from interp.bootstrap import Resampler, check_bootstrap, item_keys
from interp.data import Batch
from interp.errors import InputError, public
from interp.record.fingerprint import DataHasher
from interp.models.bridge import InterpBridge, require_bridge

KEYS = ["layer", "head", "position"]


@public
def sink_profiles_by_item(model: InterpBridge, data: Any, *, threshold: float = SINK_THRESHOLD,
                          layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
                          positions: Any = None, max_batches: Optional[int] = None) -> pd.DataFrame:
    """``sink_profile`` of every item of ``data`` on its own, concatenated, with an ``item`` column (the
    item's key: a hash of its real tokens or pixels and label, ``:index`` added to a repeated item) and
    ``item_index`` (its place in the data). One forward per batch: each item's rows of the batch's patterns
    feed that item's own profile, so each table equals ``sink_profile(model, [that item])`` (its
    ``n_batches`` 1, its ``data_fingerprint`` the item's). No ``remove`` here (it reruns the model)."""
    require_bridge(model, "sink_profiles_by_item")
    template = _profile_part(model, threshold, layers, heads, positions, None)
    items: list[tuple[str, Any, str]] = []  # (key, part, data fingerprint)

    # the part reduces inside the forward's hooks (one layer at a time); here the batch's patterns are kept
    # and each item's own part is driven with its rows of them, in the order the forward would call its hooks
    pattern_hooks = [name for name, _ in template.batch_hooks(None)]

    def consume(batch: Batch, store: dict) -> None:
        n = batch.inputs.shape[0]
        for row, key in enumerate(item_keys(batch)):
            one = Batch(*(None if t is None else t[row:row + 1] for t in (batch.inputs, batch.attention_mask,
                                                                         batch.labels)))
            part = _profile_part(model, threshold, layers, heads, positions, None)
            for name, hook in part.batch_hooks(one):
                t = store[name]
                hook(t[row:row + 1] if t.shape[0] == n else t, SimpleNamespace(name=name))
            part.consume(one, {})
            hasher = DataHasher()
            hasher.update(one)
            seen = {k for k, _, _ in items}
            items.append((key if key not in seen else f"{key}:{len(items)}", part, hasher.hexdigest()))

    stream_batches(model, data, max_batches, pattern_hooks, consume, desc="sink profile per item", progress=False,
                   stop_at_layer=template.blocks)
    if not items:
        raise InputError("sink_profiles_by_item got no items: pass at least one batch")
    return pd.concat([part.finish(1, fp, None).assign(item=key, item_index=i)
                      for i, (key, part, fp) in enumerate(items)], ignore_index=True)


def _per_item(table: pd.DataFrame, value: str, item: str) -> tuple[list[str], dict[str, tuple]]:
    """Per position class: (heads, [items, heads] rows r_th, [items, heads] sums r_th v_th); the item keys."""
    weight = "n_query_rows" if "n_query_rows" in table else "n_rows"
    keys = list(dict.fromkeys(table[item].astype(str)))
    out = {}
    for position, part in table.groupby("position", sort=False):
        grid = part.assign(_item=part[item].astype(str)).pivot_table(
            index="_item", columns=["layer", "head"], values=[value, weight], aggfunc="first", dropna=False)
        rows = grid[weight].reindex(keys).to_numpy(float)
        if np.isnan(rows).any() or np.isnan(grid[value].reindex(keys).to_numpy(float)[rows > 0]).any():
            raise InputError(f"position {position!r}: some item has no row for some head; every item's profile "
                             "must cover the same layers, heads and classes (sink_profiles_by_item gives that)")
        sums = np.nan_to_num(grid[value].reindex(keys).to_numpy(float)) * rows
        out[str(position)] = (rows, sums, grid[weight].shape[1])
    return keys, out


def _check_table(table: Any, value: str, item: str) -> None:
    need = {*KEYS, value, item}
    if not isinstance(table, pd.DataFrame) or not need <= set(table.columns) or \
            not {"n_rows", "n_query_rows"} & set(table.columns):
        raise InputError(f"sink_share_intervals takes per-item sink profiles: a DataFrame with the columns "
                         f"{sorted(need)} and n_query_rows or n_rows (interp.analysis.sink_intervals."
                         "sink_profiles_by_item(model, data))")
    if table.duplicated([item, *KEYS]).any():
        raise InputError("some (item, layer, head, position) appears more than once: one profile per item")


def _resampled_shares(per_item: Any, value: str, threshold: Optional[float], item: str, n_boot: Any,
                      seed: Any) -> tuple[Resampler, float, dict[str, tuple]]:
    """(resampler, threshold, per class: (share, [n_boot] resampled shares, heads, sink heads)) (module doc)."""
    _check_table(per_item, value, item)
    t = check_threshold(per_item.threshold.iloc[0] if threshold is None and "threshold" in per_item else
                        threshold, "threshold")
    n_boot, seed = check_bootstrap(n_boot, seed)
    keys, classes = _per_item(per_item, value, item)
    boot = Resampler(keys, n_boot, seed)
    out = {}
    for position, (r, s, n_heads) in classes.items():
        with np.errstate(divide="ignore", invalid="ignore"):
            pooled = s.sum(0) / r.sum(0)
            resampled = boot.sums(s) / boot.sums(r)  # [n_boot, heads]
        out[position] = (float((pooled > t).mean()), (resampled > t).mean(1), n_heads, int((pooled > t).sum()))
    return boot, t, out


@public
def sink_share_intervals(per_item: pd.DataFrame, *, value: str = "mass", threshold: Optional[float] = None,
                         item: str = "item", n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per position class: the share of heads whose pooled ``value`` exceeds ``threshold`` and its 95%
    bootstrap interval over items (module doc). ``per_item``: ``sink_profiles_by_item``'s table.
    ``threshold`` None: the profile's own ``threshold`` column. Columns: position, value, threshold, n_items,
    n_heads, n_sink_heads, share, share_lo, share_hi, n_boot, seed."""
    boot, t, classes = _resampled_shares(per_item, value, threshold, item, n_boot, seed)
    rows = []
    for position, (share, resampled, n_heads, n_sinks) in classes.items():
        lo, hi = boot.interval(resampled[:, None])
        rows.append(dict(position=position, value=value, threshold=t, n_items=boot.weights.shape[1],
                         n_heads=n_heads, n_sink_heads=n_sinks, share=share, share_lo=float(lo[0]),
                         share_hi=float(hi[0]), n_boot=boot.n_boot, seed=boot.seed))
    return pd.DataFrame(rows)


@public
def sink_share_difference(first: pd.DataFrame, second: pd.DataFrame, *, value: str = "mass",
                          threshold: Optional[float] = None, item: str = "item", n_boot: int = 1000,
                          seed: int = 0) -> pd.DataFrame:
    """Per position class both tables have: share(first) - share(second) and its 95% interval, from
    independent resamples of each table's own items (``seed`` for ``first``, ``seed + 1`` for ``second``;
    two models read different texts, so nothing pairs them): diff_b = share_b(first) - share_b(second).
    The interval excludes 0 where the data tell the two shares apart. Columns: position, value, threshold,
    share_first, share_second, diff, diff_lo, diff_hi, n_items_first, n_items_second, n_boot, seed."""
    boot_a, t, a = _resampled_shares(first, value, threshold, item, n_boot, seed)
    boot_b, _, b = _resampled_shares(second, value, t, item, n_boot, seed + 1)
    rows = []
    for position in [p for p in a if p in b]:
        lo, hi = boot_a.interval((a[position][1] - b[position][1])[:, None])
        rows.append(dict(position=position, value=value, threshold=t, share_first=a[position][0],
                         share_second=b[position][0], diff=a[position][0] - b[position][0], diff_lo=float(lo[0]),
                         diff_hi=float(hi[0]), n_items_first=boot_a.weights.shape[1],
                         n_items_second=boot_b.weights.shape[1], n_boot=boot_a.n_boot, seed=boot_a.seed))
    if not rows:
        raise InputError("the two tables share no position class: profile the same classes (positions=...)")
    return pd.DataFrame(rows)
