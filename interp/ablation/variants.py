"""Ablation variants: which (layer, head, kind) targets one ablation patches together."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

from interp.checks import as_index, check_heads, check_kinds, check_layers
from interp.errors import InputError
from interp.models.info import ModelInfo
from interp.record.patching import Target
from interp.types import IMPLICIT_KINDS, QKV, SCOPES, Scope  # IMPLICIT_KINDS: exact-only

NO_HEAD = -1  # a massive target's head: the residual stream is not per head


@dataclass(frozen=True)
class Variant:
    """One ablation: a set of (layer, head, kind) targets patched together.

    ``scope`` says what the set is: one head, every head of a layer, every head of a kind
    ("all"), or a custom set; ``layer`` and ``head`` are None where the set spans several.
    """

    targets: tuple[Target, ...]
    scope: Scope
    kind: str  # "q" | "k" | "v" | "sink_v" | "massive", or e.g. "q+v" for a custom set over several kinds
    layer: Optional[int] = None
    head: Optional[int] = None

    def key(self, method: str, estimate: str, metric: str) -> str:
        """The identity of this variant's result in a sweep log."""
        ident = [self.scope, self.layer, self.head, self.kind]
        if self.scope == "custom":
            ident.append(sorted(self.targets))
        return json.dumps([ident, method, estimate, metric])

    def label(self) -> str:
        if self.scope == "head":
            return f"L{self.layer} H{self.head} {self.kind}"
        if self.scope == "layer":
            return f"L{self.layer} {self.kind} (all heads)"
        if self.scope == "all":
            return f"every {self.kind}"
        return f"{len(self.targets)} targets ({self.kind})"


def _custom(info: ModelInfo, scope: Iterable[Target]) -> list[Variant]:
    try:
        targets = tuple(sorted({(_target_index(l), _target_index(h), str(k)) for l, h, k in scope}))
    except (TypeError, ValueError):
        raise InputError(
            f"scope must be 'head', 'layer', 'all' or a list of (layer, head, kind); got {scope!r}"
        ) from None
    if not targets:
        raise InputError("scope is an empty list of targets: name at least one (layer, head, kind)")
    for layer, head, kind in targets:
        if not 0 <= layer < info.n_layers or kind not in QKV + IMPLICIT_KINDS or not _head_ok(info, head, kind):
            raise InputError(f"target {(layer, head, kind)} out of range for {info.name} (kinds q, k, v, sink_v, "
                             f"massive; a massive target names the whole residual stream: head {NO_HEAD})")
    return [Variant(targets, "custom", "+".join(sorted({k for _, _, k in targets})))]


def _target_index(value: object) -> int:
    """A target's layer or head: an integer (``interp.checks.as_index``), never a bool or a float (int() would
    read True as 1 and 2.7 as 2)."""
    index = as_index(value)
    if index is None:
        raise TypeError(f"not an integer index: {value!r}")
    return index


def _head_ok(info: ModelInfo, head: int, kind: str) -> bool:
    if kind == "massive":
        return head == NO_HEAD
    return 0 <= head < info.heads("v" if kind == "sink_v" else kind)


def make_variants(info: ModelInfo, kinds: Sequence[str], scope: Union[str, Iterable[Target]],
                  layers: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None) -> list[Variant]:
    """Variants for ``scope`` within the selected ``layers`` and ``heads`` (None: all): "head" (each
    selected head alone), "layer" (the selected heads of each selected layer together), "all" (every
    selected head of a kind together), or explicit targets. Under grouped-query attention k and v
    have fewer heads: their selection is the selected heads below ``n_kv_heads``. ``sink_v`` (a kv head's
    values at the sink positions) has v's heads; ``massive`` (residual entries past Sun et al.'s criterion)
    is one target per layer, (layer, -1, "massive"): "head" and "layer" give one variant per layer, "all" one."""
    kinds = check_kinds(kinds, QKV + IMPLICIT_KINDS)
    if not isinstance(scope, str):
        if layers is not None or heads is not None:
            raise InputError("layers= and heads= select among scope='head' / 'layer' / 'all' variants; a list of "
                             "targets already names its heads: leave layers and heads out")
        return _custom(info, scope)
    layers, heads = check_layers(layers, info), check_heads(heads, info)
    chosen = {k: [NO_HEAD] if k == "massive" else [h for h in heads if h < info.heads("v" if k == "sink_v" else k)]
              for k in kinds}
    empty = [k for k in kinds if not chosen[k]]
    if empty:
        raise InputError(f"heads={heads} selects no {'/'.join(empty)} head: {info.name} has {info.n_kv_heads} kv heads "
                         f"(k and v) and {info.n_heads} query heads")
    if scope == "head":
        return [Variant(((l, h, k),), "head", k, l, h) if k != "massive" else Variant(((l, h, k),), "layer", k, l)
                for k in kinds for l in layers for h in chosen[k]]
    if scope == "layer":
        return [Variant(tuple((l, h, k) for h in chosen[k]), "layer", k, l) for k in kinds for l in layers]
    if scope == "all":
        return [Variant(tuple((l, h, k) for l in layers for h in chosen[k]), "all", k) for k in kinds]
    raise InputError(
        f"scope must be one of {', '.join(s for s in SCOPES if s != 'custom')} or a list of "
        f"(layer, head, kind); got {scope!r}"
    )
