"""Prefix reuse for exact sweeps: a variant patched at layer l runs only layers l..L-1.

Layers before the first patched one compute exactly what the intact run computed, so the
intact forward records what each block returned (``record_block_outputs``) and a patched
forward replays those outputs for blocks 0..l-1 (``replay_blocks``) instead of recomputing
them. The replay is a context manager that gives each skipped block a ``forward`` of its
own for the duration of one forward and deletes it afterwards (the class's own forward is
never touched), so the model is unchanged outside it.

Cost: an exact per-head sweep over L layers runs on average (L + 1) / 2 layers per variant
instead of L; the sweep records one batch's block outputs at a time (L x batch x pos x d_model
values) and drops them before the next batch (``interp.ablation.sweep._exact``), so the memory does
not grow with the data.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from torch import Tensor, nn

from interp.models.bridge import InterpBridge


def _blocks(model: InterpBridge) -> list[nn.Module]:
    return [model.blocks[layer] for layer in range(model.interp.n_layers)]


@contextmanager
def record_block_outputs(model: InterpBridge) -> Iterator[list[Any]]:
    """Inside the block, every forward appends, per layer, what that block returned."""
    outputs: list[Any] = [None] * model.interp.n_layers

    def keeper(layer: int):
        def keep(module: nn.Module, args: Any, output: Any) -> None:
            outputs[layer] = _detach(output)
        return keep

    handles = [block.register_forward_hook(keeper(layer)) for layer, block in enumerate(_blocks(model))]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def _detach(output: Any) -> Any:
    if isinstance(output, Tensor):
        return output.detach()
    if isinstance(output, tuple):
        return tuple(_detach(o) for o in output)
    return output


def repeat_output(output: Any, n: int, batch_size: int) -> Any:
    """``output`` with every tensor whose leading axis is the batch repeated ``n`` times (variant-major)."""
    if isinstance(output, Tensor):
        if output.ndim and output.shape[0] == batch_size and n > 1:
            return output.repeat(n, *([1] * (output.ndim - 1)))
        return output
    if isinstance(output, tuple):
        return tuple(repeat_output(o, n, batch_size) for o in output)
    return output


@contextmanager
def replay_blocks(model: InterpBridge, outputs: list[Any], start: int, n: int, batch_size: int) -> Iterator[None]:
    """Blocks ``0..start-1`` return their recorded intact outputs (repeated ``n`` times) without computing."""
    skipped = _blocks(model)[:start]
    for layer, block in enumerate(skipped):
        replayed = repeat_output(outputs[layer], n, batch_size)

        def forward(*args: Any, _out: Any = replayed, **kwargs: Any) -> Any:
            return _out
        # an instance attribute that shadows the class's forward until deleted; object.__setattr__
        # because the bridge's components pass attribute writes through to the HF module they wrap
        object.__setattr__(block, "forward", forward)
    try:
        yield
    finally:
        for block in skipped:
            if "forward" in vars(block):
                object.__delattr__(block, "forward")


def output_bytes(outputs: list[Any]) -> int:
    """Bytes the recorded block outputs of one batch hold."""
    def size(o: Any) -> int:
        if isinstance(o, Tensor):
            return o.numel() * o.element_size()
        return sum(size(x) for x in o) if isinstance(o, tuple) else 0
    return sum(size(o) for o in outputs)


def first_layer(targets: Any) -> int:
    """The lowest layer a variant patches: where its forward must start."""
    return min(layer for layer, _, _ in targets)

