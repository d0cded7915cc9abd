"""The one capture loop: every streaming pass over data (``record_qkv``, ``origin_shift``'s intervals,
``score_decomposition``, ``frequency_profile``, the sink and high-norm analyzers) runs its batches through
``stream_batches``, so every pass does the same things in the same order:

1. the batch is read and checked on the host, once (``iter_batches``: ``open_data``'s decision of what the
   data are; each batch a ``CheckedBatch``: shape, dtype, vocabulary, finiteness, mask, and that its pixels
   fit the model's dtype), and hashed into the data fingerprint (``interp.record.fingerprint.DataHasher``);
2. one forward of that ``CheckedBatch`` in eval mode without gradients, with the pass's hooks, keeping the
   activations it names and ending as soon as they are kept (``run_until_kept``; the bridge skips its own
   checks for a ``CheckedBatch`` only: they would synchronise a GPU);
3. the kept activations are handed to the pass's consumer, ``consume(batch, store)`` (the checked batch,
   on the host: a consumer that runs more forwards passes it to them), and dropped before the next batch.

Returns (batches run, data fingerprint): the fingerprint is what decides "the same data" elsewhere
(``origin_shift`` intervals against the statistics they explain).

Prefix reuse (exact sweeps, the scores' patched forwards): a variant patched at layer l runs only layers l..L-1.
Layers before the first patched one compute exactly what the intact run computed, so the intact forward records
what each block returned (``record_block_outputs``) and a patched forward replays those outputs for blocks
0..l-1 (``replay_blocks``) instead of recomputing them. The replay is a context manager that gives each skipped
block a ``forward`` of its own for the duration of one forward and deletes it afterwards (the class's own forward
is never touched), so the model is unchanged outside it. Cost: an exact per-head sweep over L layers runs on
average (L + 1) / 2 layers per variant instead of L; the sweep records one batch's block outputs at a time
(L x batch x pos x d_model values) and drops them before the next batch (``interp.ablation.sweep``), so the memory
does not grow with the data.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from interp.data import Batch, CheckedBatch, iter_batches
from interp.data.batch import check_fits_dtype  # noqa: F401 - re-exported: the callers' name for it
from interp.record.fingerprint import DataHasher
from interp.models.bridge import InterpBridge, refuse_active_dropout

Consumer = Callable[[CheckedBatch, dict[str, Tensor]], None]
Hooks = Union[Sequence[tuple[Any, Callable]], Callable[[Batch], Sequence[tuple[Any, Callable]]]]


class StopForward(Exception):
    """Raised by a keeper once every activation a forward is read for is kept: nothing after is computed."""


@contextmanager
def evaluating(model: InterpBridge) -> Iterator[None]:
    """Eval mode and no gradients inside; the model's own mode is restored after. A model in training mode
    with dropout active is refused first, as every forward of the bridge (and ``ablate_bias``) refuses it:
    its user asked for random numbers, and silently switching it to eval would hide that."""
    refuse_active_dropout(model.hf_model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


OUTPUT, BLOCK_OUTPUTS = "output", "block_outputs"  # the store's keys for the forward's output and block outputs


def run_until_kept(model: InterpBridge, batch: Batch, names: Sequence[str], hooks: Sequence = (),
                   keep_output: bool = False, **forward: Any) -> dict[str, Any]:
    """One forward of ``batch`` with ``hooks`` that keeps the activations at ``names`` and ends as soon as all are
    kept, whatever order the family fires them in (TransformerLens' ``stop_at_layer`` does not stop blocks named
    ``encoder.layer.N``: ViT, DINOv2, BERT run to the end; and it never skips the final norm and unembedding,
    which a language model's vocabulary makes costly). A hook that never fires (a fused attention kernel
    has no pattern) lets the forward finish; the caller then finds the name missing. ``keep_output``: the
    forward runs to the end and its output (the first of a tuple) is kept too, under ``OUTPUT``.

    The forward checks ``batch`` unless it is a ``CheckedBatch`` checked for this model (``check_batch``:
    once, on the host); nothing else skips the checks."""
    store: dict[str, Any] = {}
    wanted = set(names)

    def keeper(name: str) -> Callable[[Tensor, Any], None]:
        def keep(t: Tensor, hook: Any) -> None:
            store[name] = t.detach()
            if len(store) == len(wanted) and not keep_output:
                raise StopForward
        return keep

    try:
        out = model.run_with_hooks(batch, fwd_hooks=list(hooks) + [(n, keeper(n)) for n in wanted], **forward)
    except StopForward:
        return store
    if keep_output:
        store[OUTPUT] = (out if isinstance(out, Tensor) else out[0]).detach()
    return store


def _no_consumer(batch: CheckedBatch, store: dict[str, Tensor]) -> None:
    return None


def stream_batches(model: InterpBridge, data: Any, max_batches: Optional[int], hook_names: Sequence[str],
                   consume: Optional[Consumer] = None, *, desc: str, progress: bool = True,
                   stop_at_layer: Optional[int] = None, hooks: Hooks = (), keep_output: bool = False,
                   block_outputs: bool = False, unit: str = "batch") -> tuple[int, str]:
    """Run every batch of ``data`` (at most ``max_batches``) as the module doc says; return (batches run,
    data fingerprint). ``unit``: what the progress bar counts (each of ``data``'s batches may be one item).

    ``hook_names``: activations kept and passed to ``consume(batch, store)`` (none: the forward runs to
    the end). ``hooks``: more forward hooks, or a function of the batch that returns them
    (hooks that reduce as the forward passes, and need the batch's mask). ``stop_at_layer`` also hands
    TransformerLens the number of blocks to run. ``keep_output``: the forward runs to the end and the store
    holds its output under ``OUTPUT``; ``block_outputs``: the store holds what each block returned, under
    ``BLOCK_OUTPUTS`` (``record_block_outputs``: a consumer's patched forwards can replay the
    blocks below their layer). ``data`` may be a list of ``Batch`` to run again.
    """
    info = model.interp
    consume = consume or _no_consumer
    hasher, n_batches = DataHasher(), 0
    extra = {} if stop_at_layer is None or stop_at_layer >= info.n_layers else {"stop_at_layer": stop_at_layer}
    with evaluating(model):
        for batch in tqdm(iter_batches(model, data, max_batches), desc=desc, disable=not progress, unit=unit):
            hasher.update(batch)  # a CheckedBatch: checked for this model as it was read
            extra_hooks = hooks(batch) if callable(hooks) else hooks
            with record_block_outputs(model) if block_outputs else nullcontext() as blocks:
                store = run_until_kept(model, batch, list(hook_names), extra_hooks, keep_output, **extra)
            if block_outputs:
                store[BLOCK_OUTPUTS] = blocks
            consume(batch, store)
            del store  # not held through the next batch's forward: one batch's activations alive at a time
            n_batches += 1
    return n_batches, hasher.hexdigest()


# prefix reuse (module doc): the intact run's block outputs, replayed below a patched layer

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


def _repeat_output(output: Any, n: int, batch_size: int) -> Any:
    """``output`` with every tensor whose leading axis is the batch repeated ``n`` times (variant-major)."""
    if isinstance(output, Tensor):
        if output.ndim and output.shape[0] == batch_size and n > 1:
            return output.repeat(n, *([1] * (output.ndim - 1)))
        return output
    if isinstance(output, tuple):
        return tuple(_repeat_output(o, n, batch_size) for o in output)
    return output


@contextmanager
def replay_blocks(model: InterpBridge, outputs: list[Any], start: int, n: int, batch_size: int) -> Iterator[None]:
    """Blocks ``0..start-1`` return their recorded intact outputs (repeated ``n`` times) without computing."""
    skipped = _blocks(model)[:start]
    for layer, block in enumerate(skipped):
        replayed = _repeat_output(outputs[layer], n, batch_size)

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


_KEPT_PATTERN = "_pattern"  # TransformerLens' copy of the last pattern a fused-qkv attention computed
_ABSENT = object()


class _Cast:
    """``dtype`` copies put in place of a model's floating parameters and buffers, and the originals put back.
    One copy per original tensor (tied weights share theirs); an original is never written to."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.swapped: list[tuple[nn.Module, str, str, Tensor]] = []  # (module, table, name, original)

    def cast(self, modules: Sequence[nn.Module]) -> None:
        copies: dict[int, Tensor] = {}
        for module in modules:
            for table in ("_parameters", "_buffers"):
                entries = getattr(module, table)
                for name, tensor in list(entries.items()):
                    if tensor is None or not tensor.is_floating_point() or tensor.dtype == self.dtype:
                        continue
                    copy = copies.get(id(tensor))
                    if copy is None:
                        copy = tensor.detach().to(self.dtype)
                        if isinstance(tensor, nn.Parameter):
                            copy = nn.Parameter(copy, requires_grad=False)
                        copies[id(tensor)] = copy
                    self.swapped.append((module, table, name, tensor))
                    entries[name] = copy

    def restore(self) -> None:
        while self.swapped:
            module, table, name, original = self.swapped.pop()
            getattr(module, table)[name] = original


@contextmanager
def computing_in(model: InterpBridge, dtype: torch.dtype) -> Iterator[None]:
    """Inside, ``model`` computes in ``dtype`` without a whole copy of it: every floating parameter and buffer
    outside the blocks is a ``dtype`` copy for the whole context, and a block's are copies only while that block
    runs (dropped when it returns, or when the next block starts if a forward was stopped inside it). A block
    that replays its recorded output (``replay_blocks``) computes nothing and is not cast. The model's own
    tensors are put back, untouched, on exit: a float64 check of a float32 model holds the float32 weights, the
    float64 weights outside the blocks and one block's float64 weights, not a float64 copy of the model.

    TransformerLens' fused-qkv attention keeps the last pattern it computed (``_pattern``, written, never read):
    each block's is put back as it was when the block returns, and all on exit, so no ``dtype`` pattern
    outlives its block's forward or stays on the model."""
    blocks = _blocks(model)
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    outside, running = _Cast(dtype), _Cast(dtype)
    # the bridge's tree and the HF model's: some HF modules (CLIP's pre-norm) are reached only from the latter
    every = {id(m): m for tree in (model, model.hf_model) for m in tree.modules()}
    kept = {key: vars(m).get(_KEPT_PATTERN, _ABSENT) for key, m in every.items()}

    def put_back(modules: Any) -> None:
        for m in modules:
            before = kept.get(id(m), _ABSENT)
            if before is not _ABSENT:
                vars(m)[_KEPT_PATTERN] = before
            elif _KEPT_PATTERN in vars(m):
                del vars(m)[_KEPT_PATTERN]

    def enter(block: nn.Module, args: Any, kwargs: Any) -> None:
        running.restore()
        if "forward" not in vars(block):  # a replayed block computes nothing
            running.cast(list(block.modules()))

    def leave(block: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        running.restore()
        put_back(block.modules())

    handles = []
    try:
        outside.cast([m for key, m in every.items() if key not in in_blocks])
        for block in blocks:
            handles.append(block.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(block.register_forward_hook(leave, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        put_back(every.values())
        running.restore()
        outside.restore()


@dataclass(frozen=True)
class HostCopy:
    """A small tensor kept past the forward that made it, held as Python numbers (``off_heap``)."""

    values: Any  # nested lists of numbers, or one number
    dtype: torch.dtype
    shape: tuple[int, ...]  # an empty axis leaves no trace in the lists

    def tensor(self) -> Tensor:
        return torch.tensor(self.values, dtype=self.dtype).reshape(self.shape)


def off_heap(t: Tensor) -> Union[Tensor, HostCopy]:
    """``t``, a small result a pass keeps across its forwards, where it does not fragment the process's heap.

    On the host a small tensor takes a chunk of glibc's heap from among the forward's freed temporaries and pins it
    there for as long as it is kept: the next forward's temporaries no longer fit the holes and the heap grows
    instead (the resident set at glibc's defaults then climbs forward after forward while the bytes in use do
    not). Python numbers live in Python's own arenas, not among the temporaries. On a GPU ``t`` is returned as it
    is: no host sync, and the host's heap is not involved. ``tensors`` gives the tensors back."""
    if t.device.type != "cpu":
        return t
    return HostCopy(t.detach().tolist(), t.dtype, tuple(t.shape))


def tensors(kept: Sequence[Union[Tensor, HostCopy]]) -> list[Tensor]:
    """The tensors ``off_heap`` kept, equal to the ones it was given (Python numbers hold float32 and float64
    exactly)."""
    return [k.tensor() if isinstance(k, HostCopy) else k for k in kept]
