"""Names for the choices the API takes, and the tensor shapes that cross functions.

Shape glossary (TransformerLens' axis names, used in the jaxtyping annotations)::

    batch        sequences or images in a batch
    pos          token positions (LMs) or prefix tokens + patches (ViTs)
    query_pos    positions that attend (rows of a pattern)
    key_pos      positions attended to (columns of a pattern)
    head_index   attention heads of a kind (kv heads for k and v under grouped-query attention)
    d_head       dimension of one head's q/k/v vector
    d_model      width of the residual stream

``hook_q|hook_k|hook_v`` are ``[batch pos head_index d_head]``;
``hook_attn_scores|hook_pattern`` are ``[batch head_index query_pos key_pos]``.
"""

from __future__ import annotations

from typing import Literal, get_args

#: which projection a bias belongs to
Kind = Literal["q", "k", "v", "o"]
#: the biases that can be recorded and patched (o is never patched: it is not per head)
QKVKind = Literal["q", "k", "v"]
#: what replaces an ablated bias (see ``interp.ablation``)
Method = Literal["zero", "mean", "fold"]
#: how an ablation's effect is measured
Estimate = Literal["exact", "attribution"]
#: which part of an activation a statistic describes: a = XW + b ("full") or XW ("content")
Part = Literal["full", "content"]
#: which heads one ablation variant patches together
Scope = Literal["head", "layer", "all", "custom"]
#: input modality of a model family
Modality = Literal["text", "vision"]
#: attention direction of a model family
Attention = Literal["causal", "bidirectional"]
#: how a family encodes positions (decides whether b_k can change the pattern)
Positions = Literal["learned", "rotary", "alibi", "relative", "none"]

KINDS: tuple[str, ...] = get_args(Kind)
QKV: tuple[str, ...] = get_args(QKVKind)
METHODS: tuple[str, ...] = get_args(Method)
ESTIMATES: tuple[str, ...] = get_args(Estimate)
PARTS: tuple[str, ...] = get_args(Part)
SCOPES: tuple[str, ...] = get_args(Scope)
POSITIONS: tuple[str, ...] = get_args(Positions)
