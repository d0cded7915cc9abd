"""Names for the choices the API takes, and the tensor shapes that cross functions.

The shape glossary (TransformerLens' axis names) opens the package docstring, ``interp.__doc__``.
"""

from __future__ import annotations

from typing import Literal, get_args

#: which projection a bias belongs to
Kind = Literal["q", "k", "v", "o"]
#: the biases that can be recorded and patched (o is never patched: it is not per head)
QKVKind = Literal["q", "k", "v"]
#: what replaces an ablated bias (see ``interp.ablation``)
Method = Literal["zero", "mean", "layer_mean", "fold", "random"]
#: how an ablation's effect is measured
Estimate = Literal["exact", "attribution", "atp", "atp_distance", "auto"]
#: which part of an activation a statistic describes: a = XW + b ("full") or XW ("content")
Part = Literal["full", "content"]
#: which heads one ablation variant patches together
Scope = Literal["head", "layer", "all", "custom"]
#: input modality of a model family
Modality = Literal["text", "vision"]
#: attention direction of a model family
Attention = Literal["causal", "bidirectional"]
#: how image pixels are normalised when a researcher's own images are read
Normalize = Literal["model", "imagenet", "none"]
#: how a family encodes positions (decides whether b_k can change the pattern)
Positions = Literal["learned", "rotary", "alibi", "relative", "none"]

KINDS: tuple[str, ...] = get_args(Kind)
QKV: tuple[str, ...] = get_args(QKVKind)
#: the biases a model makes for itself that ``ablate_bias`` can also remove (exact forwards only)
IMPLICIT_KINDS: tuple[str, ...] = ("sink_v", "massive")
METHODS: tuple[str, ...] = get_args(Method)
ESTIMATES: tuple[str, ...] = get_args(Estimate)
PARTS: tuple[str, ...] = get_args(Part)
SCOPES: tuple[str, ...] = get_args(Scope)
POSITIONS: tuple[str, ...] = get_args(Positions)
NORMALIZE: tuple[str, ...] = get_args(Normalize)
#: the CLI's --estimate: the API's estimates, and "both" (attribution, then exact, one table each)
CLI_ESTIMATES: tuple[str, ...] = (*ESTIMATES, "both")
#: the CLI's --scope: every scope but "custom" (a list of targets, which the API takes)
CLI_SCOPES: tuple[str, ...] = tuple(s for s in SCOPES if s != "custom")
#: the demo's --ablation-estimate: the two that rank every head
DEMO_ESTIMATES: tuple[str, ...] = ("auto", "exact")
#: the analyses ``interp.compare_models`` (and ``interp compare``) can run on several models side by side
COMPARE_ANALYSES: tuple[str, ...] = ("origin", "scores", "sinks", "residual")
#: each paragraph of a text corpus cut to this many characters in a comparison, so every tokenizer reads it whole
COMPARE_MAX_CHARS: int = 400
