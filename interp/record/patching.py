"""Forward hooks that patch biases out at inference time (weights untouched).

For a target (layer l, head h, kind c) the hook on ``blocks.{l}.attn.hook_{c}`` edits the
activation a = XW + b of that head:

* ``method="zero"``: a' = a - b = XW (the head's origin falls back to E[X]W).
* ``method="mean"``: a' = a - b + E[XW], i.e. the learned bias b is replaced by the
  data-induced origin E[XW] (the content mean from ``record_qkv`` on the same data).
* ``method="layer_mean"``: a' = a - b_h + mean over the layer's heads of b (kv heads for k
  and v): does each head need its *own* bias, or would the layer's average do?
* ``method="fold"`` (v only): a' = a - b_v, and sum_h b_v[h] W_O[h] (``v_fold_vector``)
  is added to the attention output; exact, so its effect is rounding only.
* ``method="random"``: a' = a - b + r, r a random direction with ||r_h|| = ||b_h|| for every head
  (``random_bias``, fixed by ``seed``): the bias *replaced* by a meaningless vector of its norm. It is not a
  matched control for zeroing: zeroing displaces a by ||b_h||, the replacement by ||r_h - b_h||, about
  sqrt(2) ||b_h|| in high dimension.

Where the architecture has no bias at a site (``bias_spec``'s ``present`` False: SmolLM2's q, k, v) every method
leaves a unchanged (a' - a = 0; ``displacement_norm`` 0 and so the matched control's draws too): a bias that is not
there is neither removed nor replaced by E[XW].

The matched control's draw d (``interp.ablation.control``): whatever the method's displacement s_h = a' - a of
each targeted head (-b_h for zero, E[XW]_h - b_h for mean, ...), a' = a + u_h^(d) ||s_h||, with u_h^(d) a uniformly
random unit vector (``matched_shift``, fixed by (seed, layer, kind, d)): the same displacement norm in a random
direction. ``ablate_bias`` checks its model, targets, method and statistics once, at its door (``check_patch``), and
builds the hooks of every patched forward with ``patch_hooks`` (``bias_patch_hooks`` without the checks) and
``shift_hook``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from interp.checks import as_index
from interp.errors import InputError, public
from interp.record.heads import attention_weights, kv_group, v_fold_vector
from interp.record.hooks import attn_hook, hook_name
from interp.models.bridge import InterpBridge, require_bridge
from interp.record.stats import QKVStats, require_stats
from interp.types import METHODS, Method

Target = tuple[int, int, str]  # (layer, head, kind)
Hook = tuple[str, Callable[[Tensor, Any], Optional[Tensor]]]
_QKV_KINDS = ("q", "k", "v")


def check_method(method: str, targets: Sequence[Target], stats: Optional[QKVStats], need_stats: bool = True) -> None:
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if method == "fold" and any(k != "v" for _, _, k in targets):
        raise InputError("method='fold' applies to v only (b_v folds exactly into b_O)")
    if method == "mean" and stats is None and need_stats:
        raise InputError("method='mean' needs stats from record_qkv (the content means)")


def _needs_means(model: InterpBridge, method: str, targets: Sequence[Target]) -> bool:
    """Whether ``method`` needs the content means E[XW] (``record_qkv``) for ``targets``: "mean" on a bias the
    architecture has (an absent one is shifted by 0, ``bias_shift``); implicit kinds (sink_v, massive) are not
    bias targets here."""
    if method != "mean":
        return False
    sites = {(layer, kind) for layer, _, kind in targets if kind in _QKV_KINDS}
    present = {layer: attention_weights(model, layer).present for layer in {layer for layer, _ in sites}}
    return any(present[layer][kind] for layer, kind in sites)


def check_patch(model: InterpBridge, method: str, targets: Sequence[Target], stats: Optional[QKVStats],
                need_stats: bool = True) -> bool:
    """A patch's checks, once, at the door of what builds its hooks (``bias_patch_hooks``, ``ablate_bias``): the
    method against the targets (``check_method``; the content means required where ``method`` needs them and
    ``need_stats``) and ``stats``, where given, as statistics of this model. Returns whether ``method`` needs the
    content means for ``targets`` (``_needs_means``)."""
    means = _needs_means(model, method, targets)
    check_method(method, targets, stats, need_stats=need_stats and means)
    if stats is not None:
        require_stats(stats).require_model(model)
    return means


def _check_targets(model: InterpBridge, targets: Any, function: str) -> list[Target]:
    """``targets`` as a list of (layer, head, kind) with Python ints, or one InputError naming the bad target and the
    fix: a bare (layer, head, kind) instead of a list, a head that is None, not an integer, or out of range for its
    kind (k and v have ``n_kv_heads`` heads under grouped-query attention). Layers are checked by the callers."""
    info = model.interp
    example = "[(0, 1, 'q')]"
    if isinstance(targets, (str, bytes)) or not isinstance(targets, (list, tuple)):
        raise InputError(f"{function} takes a list of (layer, head, kind) targets, e.g. {example}; got "
                         f"{type(targets).__name__}")
    if len(targets) == 3 and as_index(targets[0]) is not None and isinstance(targets[2], str):
        raise InputError(f"{function} takes a list of (layer, head, kind) targets: got one bare target "
                         f"{tuple(targets)!r}; wrap it in a list: [{tuple(targets)!r}]")
    checked: list[Target] = []
    for target in targets:
        if not isinstance(target, (list, tuple)) or len(target) != 3:
            raise InputError(f"{function}: each target is (layer, head, kind), e.g. (0, 1, 'q'); got {target!r}")
        layer, head, kind = as_index(target[0]), as_index(target[1]), target[2]
        if layer is None or head is None:
            raise InputError(f"{function}: target {tuple(target)!r} needs an integer layer and head (a head of None "
                             f"is not 'every head': list each head, e.g. [(l, h, kind) for h in range(n)])")
        if kind in _QKV_KINDS:
            n = info.n_heads if kind == "q" else info.n_kv_heads
            if not 0 <= head < n:
                raise InputError(f"{function}: target {tuple(target)!r}: head {head} out of range for {kind} "
                                 f"({info.name} has {n} {kind} heads: 0..{n - 1})")
        checked.append((layer, head, kind))
    return checked


def random_bias(bias: Tensor, layer: int, kind: str, seed: int = 0) -> Tensor:
    """A random direction per head with each head's norm of ``bias`` [head_index, d_head]: Gaussian
    directions drawn in float64 on the host from a generator seeded by (seed, layer, kind), so a
    head's vector does not depend on which other heads or variants are run."""
    return _scaled_directions(bias, [int(seed), int(layer), "qkv".index(kind)])


def _scaled_directions(like: Tensor, entropy: list[int]) -> Tensor:
    """Per row of ``like`` [head_index, d_head], a uniformly random unit direction (Gaussian, float64, on the host,
    from a generator seeded by ``entropy``) scaled to that row's norm; ``like``'s device and dtype."""
    state = np.random.SeedSequence(entropy).generate_state(2)
    generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    z = torch.randn(like.shape, generator=generator, dtype=torch.float64)
    norms = like.detach().double().cpu().norm(dim=-1, keepdim=True)
    return (z / z.norm(dim=-1, keepdim=True) * norms).to(like.device, like.dtype)


def bias_shift(model: InterpBridge, layer: int, kind: str, method: Method,
               stats: Optional[QKVStats] = None, seed: int = 0) -> Tensor:
    """a' - a for every head of (layer, kind): [head_index, d_head] (-b, E[XW] - b, mean_h b - b or r - b).

    Where the architecture has no bias at the site (``bias_spec``'s ``present`` False) it is exactly 0 for every
    method: there is no b to remove or replace, so "mean" does not add E[XW] (that would move a head that has
    no bias, and an ablation would report the move as the bias's effect)."""
    weights = attention_weights(model, layer)
    bias = weights.bias(kind)
    if not weights.present[kind]:
        return torch.zeros_like(bias)
    shift = -bias.clone()
    if method == "mean":
        shift = shift + stats.mean(layer, kind, "content").to(shift.device, shift.dtype)
    elif method == "layer_mean":
        shift = shift - shift.mean(dim=0, keepdim=True)  # -b_h + mean_h b
    elif method == "random":
        shift = shift + random_bias(bias, layer, kind, seed)
    return shift




def matched_shift(shift: Tensor, layer: int, kind: str, seed: int, draw: int) -> Tensor:
    """Draw ``draw`` of the matched control of ``shift`` [head_index, d_head]: per head, a uniformly random
    unit direction (Gaussian, float64, on the host, from (seed, layer, kind, draw): independent of which other
    heads or variants run, and of ``method="random"``'s stream) scaled to that head's ||shift_h||."""
    if isinstance(draw, bool) or not isinstance(draw, int) or draw < 0:
        raise InputError(f"a control draw is an integer >= 0; got {draw!r}")
    return _scaled_directions(shift, [int(seed), int(layer), "qkv".index(kind), int(draw), 1])


def by_site(targets: Sequence[Target]) -> dict[tuple[int, str], set[int]]:
    """The targeted heads of each hook site, (layer, kind) -> heads, in the targets' order of sites."""
    sites: dict[tuple[int, str], set[int]] = {}
    for layer, head, kind in targets:
        sites.setdefault((layer, kind), set()).add(head)
    return sites


def _only_heads(shift: Tensor, heads: set[int]) -> Tensor:
    """``shift`` [head_index, d_head] on ``heads``, zero on the other heads of the site."""
    delta = torch.zeros_like(shift)
    idx = torch.tensor(sorted(heads))
    delta[idx] = shift[idx]
    return delta


def _add(delta: Tensor) -> Callable[[Tensor, Any], Tensor]:
    def edit(t: Tensor, hook: Any) -> Tensor:
        return t + delta.to(t.device, t.dtype)
    return edit


def shift_hook(layer: int, kind: str, shift: Tensor, heads: set[int]) -> Hook:
    """The hook at (layer, kind) that adds ``shift`` [head_index, d_head] to the activations of ``heads`` (the
    site's other heads pass unchanged)."""
    return hook_name(layer, kind), _add(_only_heads(shift, heads))


@public
def bias_patch_hooks(model: InterpBridge, targets: Sequence[Target], method: Method = "zero",
                     stats: Optional[QKVStats] = None, seed: int = 0) -> list[Hook]:
    """Forward hooks that patch the biases of ``targets`` out (see the module doc for methods;
    ``seed`` fixes ``method="random"``'s directions)."""
    model = require_bridge(model, "bias_patch_hooks")
    targets = _check_targets(model, targets, "bias_patch_hooks")
    check_patch(model, method, targets, stats)
    return patch_hooks(model, targets, method, stats, seed)


def patch_hooks(model: InterpBridge, targets: Sequence[Target], method: Method, stats: Optional[QKVStats] = None,
                seed: int = 0, fold_dtype: Optional[torch.dtype] = None) -> list[Hook]:
    """``bias_patch_hooks`` of a bridge, targets, method and statistics already checked (``ablate_bias`` checks
    them once, at its door, and builds hooks for every patched forward). ``fold_dtype``: the dtype "fold" sums
    b_v W_O in (None: the weights'; a float64 check of a float32 model asks for float64)."""
    info = model.interp
    hooks: list[Hook] = []
    for (layer, kind), heads in by_site(targets).items():
        hooks.append(shift_hook(layer, kind, bias_shift(model, layer, kind, method, stats, seed), heads))
        if method == "fold":
            group = kv_group(info.n_heads, info.n_kv_heads)
            query_heads = [qh for qh in range(info.n_heads) if group[qh] in heads]
            hooks.append((attn_hook(layer, "o.hook_out"), _add(v_fold_vector(model, layer, query_heads, fold_dtype))))
    return hooks


def stack_hooks(per_variant: Sequence[Sequence[Hook]]) -> list[Hook]:
    """One hook per hook point for ``len(per_variant)`` variants stacked on the batch axis (variant-major):
    rows ``v*B:(v+1)*B`` of the activation go through variant v's hook at that point (or pass unchanged)."""
    n = len(per_variant)
    sites: dict[str, list[Optional[Callable]]] = {}
    for v, hooks in enumerate(per_variant):
        for name, fn in hooks:
            sites.setdefault(name, [None] * n)[v] = fn

    def stacked(fns: list) -> Callable[[Tensor, Any], Tensor]:
        def edit(t: Tensor, hook: Any) -> Tensor:
            chunks = list(t.chunk(n, dim=0))
            return torch.cat([c if f is None else f(c, hook) for c, f in zip(chunks, fns)], dim=0)
        return edit

    return [(name, stacked(fns)) for name, fns in sites.items()]


def stacked_patch_hooks(model: InterpBridge, groups: Sequence[Sequence[Target]], method: Method = "zero",
                        stats: Optional[QKVStats] = None, seed: int = 0) -> list[Hook]:
    """Hooks for ``len(groups)`` variants stacked on the batch axis (variant-major).

    Rows ``v*B:(v+1)*B`` of every activation get variant v's patch, so one forward on a
    batch repeated V times equals V separate patched forwards.
    """
    return stack_hooks([bias_patch_hooks(model, group, method, stats, seed) for group in groups])

