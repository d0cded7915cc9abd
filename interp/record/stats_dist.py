"""``QKVStats.all_reduce``: the statistics of every rank of a ``torch.distributed`` group, in rank order.

Only tensors cross processes (``all_gather`` of counts, means, co-moments and flags, and of the
metadata as padded bytes; no pickling), so it works with gloo (CPU) and NCCL (CUDA) alike.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from interp.errors import InputError, InterpError
from interp.record.stats_format import state_of

__all__ = ["gather_states"]


def gather_states(stats: Any, signature: tuple, group: Any = None) -> list[dict]:
    """Every rank's state (``interp.record.stats_format.state_of``), in rank order; each rank gets all of them.
    Refused unless every rank recorded the same model, layers and kinds (``signature``)."""
    if not dist.is_available() or not dist.is_initialized():
        raise InterpError("all_reduce needs an initialised torch.distributed process group")
    world = dist.get_world_size(group)
    device = next(iter(stats.moments.values())).mean.device
    ident = _text_tensor(json.dumps([list(map(str, signature)), stats.kinds]), device)
    if any(not torch.equal(t, ident) for t in _gather(ident, world, group)):
        raise InputError("all_reduce: the ranks recorded different models, layers or kinds")
    data = _gather(_text_tensor(str(stats.data_fingerprint), device), world, group)
    mine = state_of(stats)
    gathered = {name: _gather(t.to(device), world, group) for name, t in sorted(mine["tensors"].items())}
    return [{"meta": dict(mine["meta"], data_fingerprint=bytes(data[rank].tolist()).decode().rstrip()),
             "tensors": {name: parts[rank].cpu() for name, parts in gathered.items()}} for rank in range(world)]


def _text_tensor(text: str, device: Any, length: int = 4096) -> Tensor:
    raw = text.encode()[:length].ljust(length)
    return torch.tensor(list(raw), dtype=torch.uint8, device=device)


def _gather(t: Tensor, world: int, group: Any) -> list[Tensor]:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts
