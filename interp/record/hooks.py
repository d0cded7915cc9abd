"""The one place hook names are spelled (TransformerLens' names on a ``TransformerBridge``).

Every other module builds a hook name through these functions, never by hand, so the vocabulary
is in one file (``tests/record/test_hooks.py`` greps the package for hand-spelled ones)::

    hook_name(3, "q")            -> "blocks.3.attn.hook_q"      # q | k | v | z | pattern | cos | sin | ...
    attn_hook(3, "o.hook_out")   -> "blocks.3.attn.o.hook_out"  # any name below the block's attention
    block_hook(3, "hook_out")    -> "blocks.3.hook_out"         # any name below the block

Shapes follow TransformerLens: ``hook_q|hook_k|hook_v|hook_z`` ``[batch, pos, head, d_head]``,
``hook_attn_scores|hook_pattern`` ``[batch, head, q_pos, k_pos]``.
"""

from __future__ import annotations

BLOCKS = "blocks."


def block_hook(layer: int, name: str) -> str:
    """``blocks.{layer}.{name}``: a hook point of the whole block (``hook_out``, ``hook_resid_pre``)."""
    return f"{BLOCKS}{int(layer)}.{name}"


def attn_hook(layer: int, name: str) -> str:
    """``blocks.{layer}.attn.{name}``: a hook point inside the block's attention (``q.hook_in``)."""
    return block_hook(layer, f"attn.{name}")


def hook_name(layer: int, kind: str) -> str:
    """``blocks.{layer}.attn.hook_{kind}``: kind is q, k, v, z, pattern, attn_scores, cos or sin."""
    return attn_hook(layer, f"hook_{kind}")


def is_block_hook(name: str) -> bool:
    """Whether ``name`` is a hook point inside a block (``blocks.`` prefix)."""
    return name.startswith(BLOCKS)
