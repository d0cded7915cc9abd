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


# Random projections whose gradients one batched backward takes (``is_grads_batched``): each of the backward's
# temporaries is this many times one backward's, and at glibc's defaults the heap grows with them (dinov2-s14, the
# demo's estimate, 2 batches in a fresh process: peak 212-217 MB above the start with all 8 at once, 124-130 MB two
# at a time, for 25% more time, as each batch of projections recomputes the checkpointed blocks; the same deltas)
PROJECTIONS_PER_BACKWARD = 2
HEAD_BLOCK_BYTES = 4 * 2**20  # float64 scores of the query heads ``_pattern_dz`` takes at a time


def _linear_shifts(model: InterpBridge, sites: list, method: Method, stats: Optional[QKVStats],
                   bias_seed: int = 0) -> dict:
    """a' - a per site [heads, d_head]; zero for ``fold``, an exact identity."""
    shift = {(l, k): bias_shift(model, l, k, method, stats, bias_seed) for l, k in sites}
    if method == "fold":
        shift = {site: torch.zeros_like(s) for site, s in shift.items()}
    return shift


def _linear_contraction(model: InterpBridge, batch: Batch, shift: Tensor) -> Callable[[Tensor], Tensor]:
    """dL/da [batch, pos, head, d_head] -> [head]: sum over the batch and (real) positions of (a' - a) . dL/da."""
    mask = batch.attention_mask if model.interp.modality == "text" else None

    def contract(grad: Tensor) -> Tensor:
        if mask is not None:
            grad = grad * mask.to(grad.device)[..., None, None].to(grad.dtype)
        return (grad.double() * shift.double().to(grad.device)[None, None]).sum((0, 1, 3))
    return contract


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


def _pattern_contraction(dz_of: Callable[[str], Tensor], kinds: Sequence[str]) -> Callable[[Tensor], Tensor]:
    """dL/dz [batch, q, head, d_head] -> [kind, query head]: per kind, sum over the batch of dz . dL/dz, dz (AtP*'s
    (A' - A) V of the layer, ``dz_of(kind)``) taken when the backward reaches the layer, if not before."""
    def contract(grad: Tensor) -> Tensor:
        g = grad.double()
        return torch.stack([(dz_of(kind) * g).sum((0, 1, 3)) for kind in kinds])
    return contract


def _per_bias_head(model: InterpBridge, kind: str, per_query_head: Tensor) -> Tensor:
    """[query head] -> [head of the kind]: a kv head's b_k moves the patterns of every query head in its group."""
    info = model.interp
    if kind != "k":
        return per_query_head
    group = torch.tensor(kv_group(info.n_heads, info.n_kv_heads))
    return torch.zeros(info.n_kv_heads, dtype=torch.float64).index_add_(0, group, per_query_head)


class _Probed(torch.autograd.Function):
    """The identity on an activation a, beside a float64 probe p of zeros whose gradient is ``contract(dL/da)``:
    the backward takes the estimate's per-head sums from each activation's gradient as it passes it, and returns
    only them. Asking for dL/da itself kept every node's [batch, pos, head, d_head] gradient, per projection,
    until the backward ended (dinov2-s14, one item, 8 projections: 72 MB of a 147 MB peak in use)."""

    @staticmethod
    def forward(a: Tensor, probe: Tensor, contract: Callable[[Tensor], Tensor]) -> Tensor:
        # a fresh node that the bridge computes *from*; it needs a gradient through the probe even where the
        # weights are frozen and nothing before it does
        return a.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.contract = inputs[2]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        return grad, ctx.contract(grad), None


def _probe(probes: dict, key: Any, size: tuple[int, ...],
           contract: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Any], Tensor]:
    """A hook replacing its activation by a ``_Probed`` node, the probe kept in ``probes[key]``."""
    def fn(t: Tensor, hook: Any) -> Tensor:
        probe = torch.zeros(size, dtype=torch.float64, device=t.device, requires_grad=True)
        probes[key] = probe
        return _Probed.apply(t, probe, contract)
    return fn


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
    """[metric][node]: d metric / d node for each metric of ``values`` (callables or ``Projections``, whose
    backwards are batched ``PROJECTIONS_PER_BACKWARD`` at a time)."""
    if isinstance(values, Projections):
        feats = values.features(out, hidden, ref, batch)
        directions = values.directions.to(feats.device, feats.dtype)
        n, out_grads = directions.shape[0], []
        for lo in range(0, n, PROJECTIONS_PER_BACKWARD):
            chunk = directions[lo:lo + PROJECTIONS_PER_BACKWARD]
            grads = torch.autograd.grad(feats, nodes, grad_outputs=chunk, is_grads_batched=True, allow_unused=True,
                                        retain_graph=lo + len(chunk) < n)
            out_grads += [[None if g is None else g[r] for g in grads] for r in range(len(chunk))]
        return out_grads
    return [list(torch.autograd.grad(value(out, hidden, ref, batch), nodes, retain_graph=i < len(values) - 1,
                                     allow_unused=True)) for i, value in enumerate(values)]


def batch_estimates(job: EstimateInputs, batch: Batch, ref: dict, values: Any, pattern: bool) -> Tensor:
    """[metric, variant]: the first-order (``pattern`` False) or AtP* delta of each variant in each metric
    of ``values`` (callables, or ``Projections``) on one batch, from one forward; the (A' - A) V of AtP*
    does not depend on the metric and is computed once. Each hooked activation's gradient is contracted to its
    per-head terms as the backward passes it (``_Probed``)."""
    model, pattern_sites, linear_sites = job.model, *job.sites(pattern)
    shift = {site: bias_shift(model, site[0], site[1], job.method, job.stats, job.bias_seed) for site in pattern_sites}
    shift.update(_linear_shifts(model, linear_sites, job.method, job.stats, job.bias_seed))
    kinds = {l: [k for l2, k in pattern_sites if l2 == l] for l, _ in pattern_sites}  # per layer, AtP*'s kinds
    read = ("q", "k", "v", "pattern") + (("cos", "sin") if model.interp.rotary else ())
    cache: dict[str, Tensor] = {}
    dz: dict[tuple[int, str], Tensor] = {}
    probes: dict[Any, Tensor] = {}  # layer -> at hook_z, [kind, query head] (AtP*); (layer, kind) -> at hook_q|k|v

    def dz_at(layer: int) -> Callable[[str], Tensor]:
        def dz_of(kind: str) -> Tensor:
            if (layer, kind) not in dz:  # without checkpointing: from the reads the forward stored, then let go
                with torch.no_grad():
                    dz.update(_pattern_dz(model, cache, [(layer, k) for k in kinds[layer]], shift))
                for n in read:
                    cache.pop(hook_name(layer, n), None)
            return dz[(layer, kind)]
        return dz_of

    hooks = []
    for l in sorted(kinds):
        z = _probe(probes, l, (len(kinds[l]), model.interp.n_heads), _pattern_contraction(dz_at(l), kinds[l]))
        hooks += (_layer_reads(model, cache, dz, z, l, read, [(l, k) for k in kinds[l]], shift) if job.checkpoint
                  else [(hook_name(l, n), _store(cache, hook_name(l, n))) for n in read] + [(hook_name(l, "z"), z)])
    hooks += [(hook_name(*site), _probe(probes, site, (shift[site].shape[0],),
                                        _linear_contraction(model, batch, shift[site]))) for site in linear_sites]
    with torch.enable_grad(), _checkpointed_blocks(model, job.checkpoint):
        out, hidden = run_forward(model, batch, hooks, job.forward_to_hidden)
        keys = list(probes)
        per_metric = _metric_grads(out, hidden, ref, batch, values, [probes[k] for k in keys])
    rows = []
    for grads in per_metric:  # a probe the metric does not reach (None) contributes nothing
        by_key = {k: torch.zeros_like(probes[k]) if g is None else g.detach().cpu() for k, g in zip(keys, grads)}
        terms = {(l, k): _per_bias_head(model, k, by_key[l][i]) for l in kinds for i, k in enumerate(kinds[l])}
        terms.update({site: by_key[site] for site in linear_sites})
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


def _layer_reads(model: InterpBridge, cache: dict, dz: dict, z_node: Callable[[Tensor, Any], Tensor], layer: int,
                 read: tuple, pattern_sites: list, shift: dict) -> list[tuple[str, Callable]]:
    """``layer``'s hooks under checkpointing: its q, k, v and pattern stored, its z replaced by ``z_node``; as soon
    as all of them have passed (the bridge fires a family's z before its pattern, as DINOv2's, or after), the
    layer's (A' - A) V is taken from them and they are dropped, so no layer's reads outlive its block in the cache
    (only autograd's saved tensors, which a checkpointed block does not keep). Measured on dinov2-s14, one item:
    22.6 MB less in use at the backward's top than taking every layer's after the backward, the same deltas."""
    names = [hook_name(layer, n) for n in read]
    passed: set[str] = set()

    def reduce(name: str) -> None:
        passed.add(name)
        if len(passed) == len(names) + 1:
            with torch.no_grad():
                dz.update(_pattern_dz(model, cache, pattern_sites, shift))
            for n in names:
                del cache[n]

    def store(name: str) -> Callable[[Tensor, Any], None]:
        def fn(t: Tensor, hook: Any) -> None:
            cache[name] = t.detach()
            reduce(name)
        return fn

    def z(t: Tensor, hook: Any) -> Tensor:
        node = z_node(t, hook)
        reduce("z")
        return node
    return [(n, store(n)) for n in names] + [(hook_name(layer, "z"), z)]


@contextmanager
def _checkpointed_blocks(model: InterpBridge, on: bool) -> Iterator[None]:
    """With ``on``, every block but the last recomputes its activations in the backward instead of keeping them
    (``torch.utils.checkpoint``, non-reentrant): the backward holds the blocks' inputs and one block's activations
    at a time, for one more forward of the blocks. The recomputation runs in the backward, after
    ``run_with_hooks`` has removed the estimate's hooks: they only read or clone (``_store``, ``_Probed``), so
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
