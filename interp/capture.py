"""The one capture loop: every streaming pass over data (``record_qkv``, ``origin_shift``'s intervals,
``score_decomposition``, ``frequency_profile``, the sink and high-norm analyzers) runs its batches through
``stream_batches``, so every pass does the same things in the same order:

1. the batch is read (``iter_batches``: ``open_data``'s decision of what the data are);
2. it is checked on the host (``Batch.check``: shape, dtype, vocabulary, finiteness, mask), once, and
   hashed into the data fingerprint (``interp.fingerprint.DataHasher``);
3. one forward in eval mode without gradients, with the pass's hooks, keeping the activations it names
   and ending as soon as they are kept (``run_until_kept``; the bridge skips its own checks, which would
   synchronise a GPU: the batch was checked in step 2);
4. the kept activations are handed to the pass's consumer and dropped before the next batch.

Returns (batches run, data fingerprint): the fingerprint is what decides "the same data" elsewhere
(``origin_shift`` intervals against the statistics they explain).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp.data import Batch, iter_batches, model_inputs
from interp.errors import InputError
from interp.fingerprint import DataHasher
from interp.models.bridge import InterpBridge, refuse_active_dropout
from interp.patching import run_until_kept

Consumer = Callable[[Batch, dict[str, Tensor], Tensor, dict], None]
Hooks = Union[Sequence[tuple[Any, Callable]], Callable[[Batch], Sequence[tuple[Any, Callable]]]]


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


def check_fits_dtype(batch: Batch, dtype: torch.dtype) -> None:
    """Pixel values finite on the host must stay finite in the model's dtype (float64 values beyond float32's
    range become inf in the cast; a float16 model overflows past 65504). Checked on the host copy, only when
    the dtypes differ."""
    x = batch.inputs
    if isinstance(x, Tensor) and x.is_floating_point() and dtype.is_floating_point and x.dtype != dtype:
        big = float(x.abs().max()) if x.numel() else 0.0
        if big > torch.finfo(dtype).max:
            raise InputError(f"pixel values reach {big:.3g}, beyond what the model's {dtype} holds "
                             f"({torch.finfo(dtype).max:.3g}): they would become inf; normalise the images first")


def _no_consumer(batch: Batch, store: dict[str, Tensor], x: Tensor, kw: dict) -> None:
    return None


def stream_batches(model: InterpBridge, data: Any, max_batches: Optional[int], hook_names: Sequence[str],
                   consume: Optional[Consumer] = None, *, desc: str, progress: bool = True,
                   stop_at_layer: Optional[int] = None, hooks: Hooks = ()) -> tuple[int, str]:
    """Run every batch of ``data`` (at most ``max_batches``) as the module doc says; return (batches run,
    data fingerprint).

    ``hook_names``: activations kept and passed to ``consume(batch, store, x, forward_kwargs)`` (none: the
    forward runs to the end). ``hooks``: more forward hooks, or a function of the batch that returns them
    (hooks that reduce as the forward passes, and need the batch's mask). ``stop_at_layer`` also hands
    TransformerLens the number of blocks to run. ``data`` may be a list of ``Batch`` to run again.
    """
    info = model.interp
    consume = consume or _no_consumer
    hasher, n_batches, dtype = DataHasher(), 0, next(model.parameters()).dtype
    extra = {} if stop_at_layer is None or stop_at_layer >= info.n_layers else {"stop_at_layer": stop_at_layer}
    with evaluating(model):
        for batch in tqdm(iter_batches(model, data, max_batches), desc=desc, disable=not progress, unit="batch"):
            batch.check(info)
            check_fits_dtype(batch, dtype)
            hasher.update(batch)
            x, kw = model_inputs(model, batch)
            extra_hooks = hooks(batch) if callable(hooks) else hooks
            store = run_until_kept(model, x, kw, list(hook_names), extra_hooks, **extra)  # checked above
            consume(batch, store, x, kw)
            del store  # not held through the next batch's forward: one batch's activations alive at a time
            n_batches += 1
    return n_batches, hasher.hexdigest()
