"""Estimates of many ablations from one forward and one backward per batch.

``attribution`` (attribution patching), linear in the patched activation a = hook_q|k|v:

    delta ~ sum over batches, positions of (a' - a) . dL/da

``atp`` (AtP*, Kramar et al. 2024) for q and k: the patched head's attention pattern is
recomputed exactly, and only what follows the head's output z = A V is linearised:

    A' = softmax(log A + dS),   dS_ij = dq_i . k_j / sqrt(d)  or  q_i . dk_j / sqrt(d)
    delta ~ sum over batches, query positions of (A' - A) V . dL/dz

(every vector rotated by its position first under rotary), which stays right where the
softmax saturates and a linear estimate through it fails. v (linear in z) is estimated as
by ``attribution``. Both are weighted by batch size like the exact metric; ``fold`` is an
exact identity, so its estimated change is zero by construction.

Memory: the backward keeps every block's activations of the batch. With ``item_sums`` (next-token NLL from
vocabulary tiles, ``interp.ablation.logits.tiled_item_sums``) the forward stops after the last block, no
[batch, pos, vocab] logits or their gradient are formed, and a batch runs in parts of ``items_per_part`` items
(``interp.ablation.memory.estimate_items``): the estimates are sums over items, so the parts add up to the whole
(tests/ablation/test_memory.py, to 1e-10 in float64).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.utils.checkpoint
from torch import Tensor

from interp.ablation.metrics import run_forward
from interp.ablation.variants import Variant
from interp.analysis.scores import apply_rotary
from interp.data import Batch
from interp.errors import InputError
from interp.record.heads import kv_group
from interp.record.hooks import hook_name
from interp.models.bridge import InterpBridge
from interp.record.patching import bias_shift
from interp.record.stats import QKVStats
from interp.types import Method


def _keep_node(acts: dict, site: Any) -> Callable[[Tensor, Any], Tensor]:
    def fn(t: Tensor, hook: Any) -> Tensor:
        # a fresh node that the bridge computes *from*, so gradients with respect to it are the metric's; on a
        # model whose weights are frozen (requires_grad False) nothing before it needs a gradient: it is a leaf
        t = t.clone()
        if not t.requires_grad:
            t.requires_grad_(True)
        acts[site] = t
        return t
    return fn


HEAD_BLOCK_BYTES = 4 * 2**20  # float64 scores of the query heads ``_pattern_dz`` takes at a time


def _linear_shifts(model: InterpBridge, sites: list, method: Method, stats: Optional[QKVStats],
                   bias_seed: int = 0) -> dict:
    """a' - a per site [heads, d_head]; zero for ``fold``, an exact identity."""
    shift = {(l, k): bias_shift(model, l, k, method, stats, bias_seed) for l, k in sites}
    if method == "fold":
        shift = {site: torch.zeros_like(s) for site, s in shift.items()}
    return shift


def _linear_terms(model: InterpBridge, grads: dict, batch: Batch, shift: dict) -> dict:
    """Per site: [head] sum over the batch and (real) positions of (a' - a) . dL/da."""
    out = {}
    for site, grad in grads.items():  # [batch, pos, head_index, d_head]
        if grad is None:
            continue
        if batch.attention_mask is not None and model.interp.modality == "text":
            grad = grad * batch.attention_mask.to(grad.device)[..., None, None].to(grad.dtype)
        out[site] = torch.einsum("bphd,hd->h", grad.double(), shift[site].double().to(grad.device)).cpu()
    return out


def _score_operands(model: InterpBridge, cache: dict, layer: int, kind: str, shift: Tensor) -> tuple[Tensor, Tensor]:
    """(q, k) [b, pos, query head, d], float64, rotated, k repeated per query head, whose product is dS when b_kind
    moves by ``shift`` [heads of kind, d]: the shift in place of the moved one."""
    info = model.interp
    q, k = cache[hook_name(layer, "q")].double(), cache[hook_name(layer, "k")].double()
    delta = shift.double().to(q.device)[None, None].expand_as(q if kind == "q" else k)
    q, k = (delta, k) if kind == "q" else (q, delta)
    if info.rotary:
        cos, sin = cache[hook_name(layer, "cos")], cache[hook_name(layer, "sin")]
        q, k = apply_rotary(q, cos.double(), sin.double()), apply_rotary(k, cos.double(), sin.double())
    return q, k[:, :, kv_group(info.n_heads, info.n_kv_heads)]


def _pattern_dz(model: InterpBridge, cache: dict, sites: list, shift: dict) -> dict:
    """Per (layer, kind): dz = (A' - A) V [b, q, head, d], A' = softmax(log A + dS) (AtP*); it does not
    depend on the metric, so one serves every metric read from the same forward. A block of query heads at a time
    (``HEAD_BLOCK_BYTES`` of float64 scores), each block's temporaries in place: the whole layer's float64
    patterns at once were ten [b, heads, q, k] temporaries (25 MB each for one item of 512 tokens and 12 heads),
    and at glibc's defaults the heap kept the holes they left between the forward's kept tensors (measured:
    ``benchmarks/memory_defaults.py --profile``)."""
    info = model.interp
    out = {}
    for layer, kind in sites:
        pattern_all = cache[hook_name(layer, "pattern")]  # [b, h, q, k]
        v = cache[hook_name(layer, "v")][:, :, kv_group(info.n_heads, info.n_kv_heads)]
        q, k = _score_operands(model, cache, layer, kind, shift[(layer, kind)])
        b, heads, n_q, n_k = pattern_all.shape
        dz = torch.empty((b, n_q, heads, v.shape[-1]), dtype=torch.float64, device=v.device)
        step = max(1, HEAD_BLOCK_BYTES // max(1, b * n_q * n_k * 8))
        for lo in range(0, heads, step):
            hs = slice(lo, lo + step)
            pattern = pattern_all[:, hs].double()
            attended = pattern > 0
            log_a = pattern.clamp_min(1e-300).log_().masked_fill_(~attended, -torch.inf)
            log_a += torch.einsum("bihd,bjhd->bhij", q[:, :, hs], k[:, :, hs]).mul_(info.score_scale(layer))
            patched = log_a.softmax(-1).masked_fill_(~attended, 0.0).sub_(pattern)
            del log_a
            dz[:, :, hs] = torch.einsum("bhij,bjhd->bihd", patched, v[:, :, hs].double())
        out[(layer, kind)] = dz
    return out


def _pattern_terms(model: InterpBridge, dz: dict, grads: dict) -> dict:
    """Per (layer, kind): [head of the kind] sum over the batch of dz . dL/dz."""
    info = model.interp
    out = {}
    for (layer, kind), d in dz.items():
        per_query_head = torch.einsum("bihd,bihd->h", d, grads[layer].double()).cpu()
        if kind == "k":  # a kv head's b_k moves the patterns of every query head in its group
            group = torch.tensor(kv_group(info.n_heads, info.n_kv_heads))
            per_query_head = torch.zeros(info.n_kv_heads, dtype=torch.float64).index_add_(0, group, per_query_head)
        out[(layer, kind)] = per_query_head
    return out


@dataclass(frozen=True)
class EstimateInputs:
    """What every one-pass estimate reads besides its metric: the model, the batches with their weights
    (tokens or items) and intact references, the variants, and how a bias is replaced."""

    model: InterpBridge
    batches: Sequence[Batch]
    weights: Sequence[float]
    variants: Sequence[Variant]
    method: Method
    stats: Optional[QKVStats]
    refs: Sequence[dict]
    need_hidden: bool
    bias_seed: int = 0  # method="random"'s directions
    # (per-item metric sums, counts) from final hidden states, with a gradient (``logits.tiled_item_sums``): the
    # forward stops after the last block and no full-vocabulary logits are formed; each batch then runs in parts
    # of ``items_per_part`` items, whose estimates add up to the batch's (module doc)
    item_sums: Optional[Callable[[Tensor, Batch], tuple[Tensor, Tensor]]] = None
    items_per_part: int = 0  # 0: whole batches
    # every block but the last recomputed in the backward (``_checkpointed_blocks``): where one item's backward
    # through all blocks exceeds the memory budget (``interp.ablation.memory.estimate_checkpoint``)
    checkpoint: bool = False

    @property
    def forward_to_hidden(self) -> bool:
        """Whether the estimate's forward stops after the last block (a hidden-state metric, or ``item_sums``)."""
        return self.need_hidden or self.item_sums is not None

    def sites(self, pattern: bool) -> tuple[list, list]:
        """(sites whose pattern AtP* recomputes: q and k when ``pattern``; sites estimated linearly)."""
        every = sorted({(l, k) for v in self.variants for l, _, k in v.targets})
        recomputed = [s for s in every if pattern and s[1] in ("q", "k")]
        return recomputed, [s for s in every if s not in recomputed]


@dataclass(frozen=True)
class Projections:
    """Several metrics g_r = sum(features * directions[r]) of one feature tensor (``interp.ablation.distance``):
    their gradients come from one batched backward (``is_grads_batched``), not one backward each."""

    features: Callable[[Any, Optional[Tensor], dict, Batch], Tensor]
    directions: Tensor  # [r, *features.shape]


def _metric_grads(out: Any, hidden: Optional[Tensor], ref: dict, batch: Batch, values: Any,
                  nodes: list[Tensor]) -> list[list[Optional[Tensor]]]:
    """[metric][node]: d metric / d node for each metric of ``values`` (callables or ``Projections``)."""
    if isinstance(values, Projections):
        feats = values.features(out, hidden, ref, batch)
        grads = torch.autograd.grad(feats, nodes, grad_outputs=values.directions.to(feats.device, feats.dtype),
                                    is_grads_batched=True, allow_unused=True)
        return [[None if g is None else g[r] for g in grads] for r in range(values.directions.shape[0])]
    return [list(torch.autograd.grad(value(out, hidden, ref, batch), nodes, retain_graph=i < len(values) - 1,
                                     allow_unused=True)) for i, value in enumerate(values)]


def batch_estimates(job: EstimateInputs, batch: Batch, ref: dict, values: Any, pattern: bool) -> Tensor:
    """[metric, variant]: the first-order (``pattern`` False) or AtP* delta of each variant in each metric
    of ``values`` (callables, or ``Projections``) on one batch, from one forward; the (A' - A) V of AtP*
    does not depend on the metric and is computed once."""
    model, pattern_sites, linear_sites = job.model, *job.sites(pattern)
    shift = {site: bias_shift(model, site[0], site[1], job.method, job.stats, job.bias_seed) for site in pattern_sites}
    shift.update(_linear_shifts(model, linear_sites, job.method, job.stats, job.bias_seed))
    layers = sorted({l for l, _ in pattern_sites})
    read = ("q", "k", "v", "pattern") + (("cos", "sin") if model.interp.rotary else ())
    cache: dict[str, Tensor] = {}
    dz: dict[tuple[int, str], Tensor] = {}
    nodes: dict[Any, Tensor] = {}  # layer -> hook_z (AtP*), (layer, kind) -> hook_q|k|v (linear)
    if job.checkpoint:
        hooks = [h for l in layers for h in _layer_reads(model, cache, dz, nodes, l, read, pattern_sites, shift)]
    else:
        hooks = ([(hook_name(l, n), _store(cache, hook_name(l, n))) for l in layers for n in read]
                 + [(hook_name(l, "z"), _keep_node(nodes, l)) for l in layers])
    hooks += [(hook_name(l, k), _keep_node(nodes, site)) for site in linear_sites for l, k in [site]]
    with torch.enable_grad(), _checkpointed_blocks(model, job.checkpoint):
        out, hidden = run_forward(model, batch, hooks, job.forward_to_hidden)
        keys = list(nodes)
        per_metric = _metric_grads(out, hidden, ref, batch, values, [nodes[k] for k in keys])
    # without checkpointing, every layer's from the cache now: made in the forward, a layer's float64 temporaries
    # would sit on top of the earlier blocks' kept activations (+10 MB at 25m@128, measured), after the backward
    # they do not; with it, any layer whose reads and z did not all pass in the forward (none measured)
    dz.update(_pattern_dz(model, cache, [s for s in pattern_sites if s not in dz], shift))
    rows = []
    for grads in per_metric:
        by_key = dict(zip(keys, grads))
        terms = _pattern_terms(model, dz, {l: by_key[l] for l in layers})
        terms.update(_linear_terms(model, {site: by_key[site] for site in linear_sites}, batch, shift))
        rows.append([float(sum(terms[(l, k)][h] for l, h, k in v.targets)) for v in job.variants])
    return torch.tensor(rows, dtype=torch.float64)


def _parts(job: EstimateInputs, batch: Batch, value: Callable, weight: float) -> Iterator[tuple[Batch, Callable]]:
    """(batch, metric) pairs whose estimates add up to the batch's: the batch and ``value`` itself; with
    ``item_sums``, parts of ``items_per_part`` items, each metric the part's sums over the whole batch's units
    (``weight``). The metric is a sum over items and no item's activations reach another's, so each item's
    gradient, and with it each term of the estimate, is the same in a part as in the whole."""
    if job.item_sums is None:
        yield batch, value
        return
    n = int(batch.inputs.shape[0])
    step = job.items_per_part if 0 < job.items_per_part < n else n
    units = max(weight, 1.0)
    item_sums = job.item_sums
    for lo in range(0, n, step):
        yield batch.items(lo, lo + step), lambda out, hidden, ref, b: item_sums(hidden, b)[0].sum() / units


def _weighted(job: EstimateInputs, value: Callable, pattern: bool) -> list[float]:
    total = sum(job.weights)
    deltas = torch.zeros(len(job.variants), dtype=torch.float64)
    for batch, ref, weight in zip(job.batches, job.refs, job.weights):
        for part, metric in _parts(job, batch, value, weight):
            deltas += batch_estimates(job, part, ref, [metric], pattern)[0] * (weight / total)
    return deltas.tolist()


def attribution_deltas(job: EstimateInputs, value: Callable) -> list[float]:
    """The first-order delta of each variant (see the module doc)."""
    return _weighted(job, value, pattern=False)


def atp_star_deltas(job: EstimateInputs, value: Callable) -> list[float]:
    """The AtP* delta of each variant (see the module doc); v targets as ``attribution_deltas``,
    from the same forward and backward."""
    spec = job.model.interp.spec
    if spec.score_refusal:
        raise InputError(f"estimate='atp' recomputes attention scores, which {spec.label} does not allow: "
                         f"{spec.score_refusal}; use estimate='attribution' or 'exact'")
    return _weighted(job, value, pattern=True)


def _store(cache: dict, name: str) -> Callable[[Tensor, Any], None]:
    def fn(t: Tensor, hook: Any) -> None:
        cache[name] = t.detach()
    return fn


def _layer_reads(model: InterpBridge, cache: dict, dz: dict, nodes: dict, layer: int, read: tuple,
                 pattern_sites: list, shift: dict) -> list[tuple[str, Callable]]:
    """``layer``'s hooks under checkpointing: its q, k, v and pattern stored, its z kept as a fresh node
    (``_keep_node``); as soon as all of them have passed (the bridge fires a family's z before its pattern, as
    DINOv2's, or after), the layer's (A' - A) V is taken from them and they are dropped, so no layer's reads
    outlive its block in the cache (only autograd's saved tensors, which a checkpointed block does not keep).
    Measured on dinov2-s14, one item: 22.6 MB less in use at the backward's top than taking every layer's after
    the backward (as the z hook alone did there), the same deltas bit for bit."""
    keep = _keep_node(nodes, layer)
    names = [hook_name(layer, n) for n in read]
    sites = [s for s in pattern_sites if s[0] == layer]
    passed: set[str] = set()

    def reduce(name: str) -> None:
        passed.add(name)
        if len(passed) == len(names) + 1:
            with torch.no_grad():
                dz.update(_pattern_dz(model, cache, sites, shift))
            for n in names:
                del cache[n]

    def store(name: str) -> Callable[[Tensor, Any], None]:
        def fn(t: Tensor, hook: Any) -> None:
            cache[name] = t.detach()
            reduce(name)
        return fn

    def z(t: Tensor, hook: Any) -> Tensor:
        node = keep(t, hook)
        reduce("z")
        return node
    return [(n, store(n)) for n in names] + [(hook_name(layer, "z"), z)]


@contextmanager
def _checkpointed_blocks(model: InterpBridge, on: bool) -> Iterator[None]:
    """With ``on``, every block but the last recomputes its activations in the backward instead of keeping them
    (``torch.utils.checkpoint``, non-reentrant): the backward holds the blocks' inputs and one block's activations
    at a time, for one more forward of the blocks. The recomputation runs in the backward, after
    ``run_with_hooks`` has removed the estimate's hooks: they only read or clone (``_store``, ``_keep_node``), so
    it saves the same tensors without them (measured: the estimates are bitwise equal), provided every block's
    input needs a gradient in both: frozen weights (requires_grad False) are made to require one meanwhile (no
    weight gradient is computed: ``torch.autograd.grad`` asks for the activations only). The last block is left
    whole: the forward stops inside it. Caches are off (a recomputation would append its keys and values to them a
    second time)."""
    if not on:
        yield
        return
    config = getattr(model.hf_model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    blocks = list(model.blocks)[:-1]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for block in blocks:  # on the instance itself: the bridge's own __setattr__ may pass it to the HF module
        object.__setattr__(block, "forward", functools.partial(_checkpoint, block.forward))
    for weight in frozen:
        weight.requires_grad_(True)
    if use_cache is not None:
        config.use_cache = False
    try:
        yield
    finally:
        for block in blocks:
            object.__delattr__(block, "forward")
        for weight in frozen:
            weight.requires_grad_(False)
        if use_cache is not None:
            config.use_cache = use_cache


def _checkpoint(forward: Callable, *args: Any, **kwargs: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
