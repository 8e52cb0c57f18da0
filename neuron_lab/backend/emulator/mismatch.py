"""Collectives whose tensors differ across ranks, caught before the data moves.

Gloo handed an all_reduce of ``[4]`` on one rank and ``[5]`` on another aborts the process that notices (a local run
lost rank 0's engine that way) or hangs. So, as PyTorch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wrapper does, each rank
first gathers every rank's fingerprint (dtype and shape, one small fixed-size all_gather), and when they differ every
rank raises :class:`CollectiveMismatch` naming each rank's shape, instead of one rank dying.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_lab.backend.emulator import interruptible

MAX_DIMS = 8  # sizes kept in a fingerprint; a tensor with more also carries its element count
_WIDTH = 3 + MAX_DIMS  # how many tensors, dtype, ndim, then sizes (or -1)
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)  # the same on every rank


class CollectiveMismatch(RuntimeError):
    """The ranks called the same collective with tensors of different shapes or dtypes."""


def _fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor:
    fp = torch.full((_WIDTH,), -1, dtype=torch.int64)
    if tensors:
        t = tensors[0]
        dims = list(t.shape)[:MAX_DIMS] if t.dim() <= MAX_DIMS else [*t.shape[:MAX_DIMS - 1], t.numel()]
        fp[:3 + len(dims)] = torch.tensor([len(tensors), _DTYPES.index(t.dtype), t.dim(), *dims])
    return fp


def _described(row: list[int]) -> str:
    count, dtype, ndim, dims = row[0], row[1], row[2], [d for d in row[3:3 + min(row[2], MAX_DIMS)]]
    if count < 0:
        return "no tensor"
    shape = f"[{', '.join(map(str, dims))}]" if ndim <= MAX_DIMS else f"{ndim} dims, {dims[-1]} elements"
    many = f" (first of {count})" if count > 1 else ""
    return f"{shape} {str(_DTYPES[dtype]).removeprefix('torch.')}{many}"


def check(gloo: Any, size: int, name: str, tensors: list[torch.Tensor]) -> None:
    """Raise :class:`CollectiveMismatch` on every rank when the ranks' ``tensors`` differ (all ranks take part)."""
    if size < 2:
        return
    mine = _fingerprint(tensors)
    every = torch.empty(size * _WIDTH, dtype=torch.int64)
    interruptible.wait(gloo._allgather_base(every, mine))
    rows = every.view(size, _WIDTH).tolist()
    if all(r == rows[0] for r in rows):
        return
    alike: dict[str, list[int]] = {}
    for rank, row in enumerate(rows):
        alike.setdefault(_described(row), []).append(rank)
    said = "; ".join(f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}: {d}" for d, r in alike.items())
    raise CollectiveMismatch(f"{name}: the ranks' tensors differ ({said}); every rank must pass the same shape and "
                             "dtype")
