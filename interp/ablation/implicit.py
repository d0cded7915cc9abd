"""Implicit-bias ablation: a head's sink values and a layer's massive activations, patched like a bias.

Two kinds sit beside ``q``, ``k``, ``v`` in ``ablate_bias`` (same metrics, rows, fingerprints, resume):

* ``sink_v`` (one target per layer x kv head, like ``v``): at the sink positions S (the position
  classes ``positions``; default: a language model's first real token, a ViT's prefix tokens), the
  head's value v_j (= x_j W_v + b_v) is replaced by 0 (``method="zero"``) or by its mean over the
  sink positions of the whole data (``"mean"``). The head's output then loses (zero) or keeps only
  the constant part of (mean) the implicit value bias c_i = sum_{j in S} a_ij v_j W_O
  (``interp.implicit_value_bias``): the pattern a is untouched.
* ``massive`` (one target per layer, head -1): in the residual stream after block l
  (``blocks.{l}.hook_out``, the stream ``interp.massive_activations`` reads), every real token's
  entry h_ic that passes Sun et al.'s criterion, |h_ic| > ``abs_threshold`` and > ``ratio_threshold``
  x the layer's median |h| over the data (the same histogram median), is set to 0 or to its channel's
  mean over the entries of the intact run that pass it. A layer with no such entry is answered
  without a forward (the row's ``identity`` says so).

Both are exact-only: a one-pass estimate (attribution, AtP*) of them is not implemented, so an
``estimate="auto"`` (or any one-pass) sweep runs these variants exactly, and their rows say
``estimate="exact"``. The intact statistics take one forward per batch (two with massive
targets); rows are keyed with the positions and thresholds, so a resumed log never mixes settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from interp.ablation.metrics import run_forward
from interp.ablation.variants import IMPLICIT_KINDS, Variant
from interp.analysis.sink_parts import AbsHistogram, check_positions, class_masks, default_sink_positions, \
    evaluating, keeper
from interp.data import Batch
from interp.errors import InputError
from interp.record.hooks import block_hook, hook_name
from interp.models.bridge import InterpBridge
from interp.record.patching import Hook, Target, stack_hooks

IMPLICIT_METHODS = ("zero", "mean")


def is_implicit(targets: Sequence[Target]) -> bool:
    return any(kind in IMPLICIT_KINDS for _, _, kind in targets)


@dataclass
class ImplicitSites:
    """What the implicit variants of one sweep share, from the intact run over its batches."""

    positions: list[str]
    abs_threshold: float
    ratio_threshold: float
    sinks: list[Tensor] = field(default_factory=list)  # per batch: [batch, pos] bool, the sink positions
    real: list[Tensor] = field(default_factory=list)  # per batch: [batch, pos] bool, real tokens
    v_mean: dict[int, Tensor] = field(default_factory=dict)  # layer -> [kv_head, d_head], mean v over S
    cutoff: dict[int, float] = field(default_factory=dict)  # layer -> max(abs, ratio x median |h|)
    n_flagged: dict[int, int] = field(default_factory=dict)  # layer -> entries past the cutoff (intact)
    massive_mean: dict[int, Tensor] = field(default_factory=dict)  # layer -> [d_model] mean of flagged entries
    index: int = 0  # the batch being run (set by the sweep before each forward)

    def detail(self) -> str:
        return json.dumps(dict(positions=self.positions, abs_threshold=self.abs_threshold,
                               ratio_threshold=self.ratio_threshold))

    def reason(self, targets: Sequence[Target]) -> str:
        """Why a variant provably changes nothing ("" when it must run)."""
        if all(kind == "massive" for _, _, kind in targets):
            layers = sorted({layer for layer, _, _ in targets})
            if not any(self.n_flagged.get(layer, 0) for layer in layers):
                where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}..{layers[-1]}"
                return (f"no massive activation at {where} (|h| > {self.abs_threshold:g} and > "
                        f"{self.ratio_threshold:g} x median): nothing to set")
        return ""


def check_implicit(model: InterpBridge, method: str, targets: Sequence[Target], positions: Any,
                   abs_threshold: float, ratio_threshold: float) -> Optional[ImplicitSites]:
    """The settings of the implicit targets among ``targets`` (None when there are none); the thresholds come
    checked (``SweepOptions``), the positions are resolved against the model here."""
    if not is_implicit(targets):
        return None
    if method not in IMPLICIT_METHODS:
        raise InputError(f"kinds sink_v and massive take method 'zero' or 'mean' (the value replaced by 0 or by "
                         f"its data mean); got method={method!r}: run them in a separate ablate_bias call")
    names = check_positions(model, default_sink_positions(model) if positions is None else positions)
    if "top_content" in names:
        raise InputError("positions='top_content' differs per head and per sequence (the most-attended token), "
                         "so sink values cannot be patched there: name fixed classes, e.g. 'first' or 'cls'")
    return ImplicitSites(names, abs_threshold, ratio_threshold)


def _masks(model: InterpBridge, sites: ImplicitSites, batch: Batch, n_pos: int, device: Any) -> None:
    real, masks = class_masks(model, batch, n_pos, device)
    sink = torch.zeros_like(real)
    for name in sites.positions:
        sink |= masks[name]
    sites.sinks.append(sink)
    sites.real.append(real)


def _intact_pass(model: InterpBridge, batches: list[Batch], names: list[str],
                 consume: Callable[[int, dict], None]) -> None:
    with evaluating(model):
        for index, batch in enumerate(batches):
            store: dict[str, Tensor] = {}
            run_forward(model, batch, [(n, keeper(store, n)) for n in names], False)
            consume(index, store)


def prepare_sites(model: InterpBridge, sites: ImplicitSites, batches: list[Batch],
                  targets: Sequence[Target]) -> ImplicitSites:
    """Fill ``sites`` from intact forwards over ``batches``: sink masks, mean sink values, massive cutoffs."""
    info = model.interp
    v_layers = sorted({layer for layer, _, kind in targets if kind == "sink_v"})
    m_layers = sorted({layer for layer, _, kind in targets if kind == "massive"})
    v_sums: dict[int, Tensor] = {}
    hists = {layer: AbsHistogram(next(model.parameters()).device) for layer in m_layers}
    n_sink: list[Any] = [0]

    def first(index: int, store: dict) -> None:
        t = next(iter(store.values()), None)
        n_pos = t.shape[1] if t is not None else batches[index].inputs.shape[1]
        _masks(model, sites, batches[index], n_pos, batches[index].inputs.device)
        sink, real = sites.sinks[-1], sites.real[-1]
        n_sink[0] = n_sink[0] + sink.sum()
        for layer in v_layers:
            v = store[hook_name(layer, "v")].double()
            v_sums[layer] = v_sums.get(layer, 0) + torch.einsum("bp,bphd->hd", sink.double(), v)
        for layer in m_layers:
            h = store[block_hook(layer, "hook_out")]
            hists[layer].add(h.abs().flatten(), real[..., None].expand_as(h).flatten())

    names = [hook_name(layer, "v") for layer in v_layers] + [block_hook(layer, "hook_out") for layer in m_layers]
    if not names:  # only the masks are needed: an embedding-length guess is not enough for a ViT
        names = [block_hook(0, "hook_out")]
    _intact_pass(model, batches, names, first)
    if v_layers and int(n_sink[0]) == 0:
        raise InputError(f"the data hold no token of the sink positions {sites.positions}: sink_v needs at least one")
    sites.v_mean = {layer: s / n_sink[0] for layer, s in v_sums.items()}
    for layer in m_layers:
        sites.cutoff[layer] = max(sites.abs_threshold, sites.ratio_threshold * hists[layer].lower_median())
    if m_layers:
        _massive_means(model, sites, batches, m_layers, info.d_model)
    return sites


def _massive_means(model: InterpBridge, sites: ImplicitSites, batches: list[Batch], layers: list[int],
                   d_model: int) -> None:
    sums = {layer: torch.zeros(d_model, dtype=torch.float64) for layer in layers}
    counts = {layer: torch.zeros(d_model, dtype=torch.float64) for layer in layers}

    def second(index: int, store: dict) -> None:
        for layer in layers:
            h = store[block_hook(layer, "hook_out")].double()
            flag = (h.abs() > sites.cutoff[layer]) & sites.real[index][..., None]
            sums[layer] += (h * flag).sum((0, 1)).cpu()
            counts[layer] += flag.sum((0, 1)).cpu().double()

    _intact_pass(model, batches, [block_hook(layer, "hook_out") for layer in layers], second)
    for layer in layers:
        sites.n_flagged[layer] = int(counts[layer].sum())
        sites.massive_mean[layer] = sums[layer] / counts[layer].clamp(min=1)  # 0 for a channel never flagged


def _rows(mask: Tensor, n: int) -> Tensor:
    """``mask`` [batch, pos] repeated to ``n`` rows (variant-major stacking)."""
    return mask if mask.shape[0] == n else mask.repeat(n // mask.shape[0], 1)


def _sink_v_hook(sites: ImplicitSites, layer: int, heads: list[int], method: str) -> Callable[[Tensor, Any], Tensor]:
    idx = torch.tensor(heads)

    def edit(t: Tensor, hook: Any) -> Tensor:
        sink = _rows(sites.sinks[sites.index], t.shape[0]).to(t.device)[:, :, None, None]
        part = t[:, :, idx.to(t.device)]
        new = torch.zeros_like(part) if method == "zero" else sites.v_mean[layer][idx].to(t.device, t.dtype)
        out = t.clone()
        out[:, :, idx.to(t.device)] = torch.where(sink, new, part)
        return out
    return edit


def _massive_hook(sites: ImplicitSites, layer: int, method: str) -> Callable[[Tensor, Any], Tensor]:
    def edit(t: Tensor, hook: Any) -> Tensor:
        real = _rows(sites.real[sites.index], t.shape[0]).to(t.device)[..., None]
        flag = (t.abs() > sites.cutoff[layer]) & real
        new = torch.zeros_like(t) if method == "zero" else sites.massive_mean[layer].to(t.device, t.dtype)
        return torch.where(flag, new, t)
    return edit


def _implicit_hooks(sites: ImplicitSites, targets: Sequence[Target], method: str) -> list[Hook]:
    """Hooks that patch the implicit ``targets`` (``sink_v`` and ``massive``; others are ignored)."""
    heads: dict[int, list[int]] = {}
    for layer, head, kind in targets:
        if kind == "sink_v":
            heads.setdefault(layer, []).append(head)
    hooks = [(hook_name(layer, "v"), _sink_v_hook(sites, layer, sorted(set(h)), method)) for layer, h in heads.items()]
    layers = sorted({layer for layer, _, kind in targets if kind == "massive"})
    return hooks + [(block_hook(layer, "hook_out"), _massive_hook(sites, layer, method)) for layer in layers]


def explicit_targets(targets: Sequence[Target]) -> list[Target]:
    """The bias targets (q, k, v) among ``targets``."""
    return [t for t in targets if t[2] not in IMPLICIT_KINDS]


def stacked_implicit_hooks(sites: Optional[ImplicitSites], groups: Sequence[Sequence[Target]],
                           method: str) -> list[Hook]:
    """Hooks for the implicit targets of ``len(groups)`` variants stacked on the batch axis (variant-major):
    rows ``v*B:(v+1)*B`` get variant v's patch (the bias targets' hooks come from ``stacked_patch_hooks``)."""
    if sites is None:
        return []
    return stack_hooks([_implicit_hooks(sites, group, method) for group in groups])


def variant_key(var: Variant, method: str, estimate: str, metric: str, sites: Optional[ImplicitSites]) -> str:
    """``var.key``, with the sink positions and massive thresholds for an implicit variant (a resumed log
    never hands over rows computed under other settings)."""
    key = var.key(method, estimate, metric)
    return json.dumps([key, sites.detail()]) if sites is not None and is_implicit(var.targets) else key
