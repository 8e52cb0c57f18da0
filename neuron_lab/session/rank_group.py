"""The process group ``%neuron ranks`` made, as the cells on its ranks meet it: code pasted from a torchrun script
calls ``init_process_group`` first and ``destroy_process_group`` last.

On an engine the workbench started (and only there, from :func:`keep` until :func:`release`), a call that asks for
the group that exists (same backend, world size and rank, or left to the defaults) returns without doing anything
and says so in one line; a call that asks for another default group raises :class:`ProcessGroupExists`, whose
traceback is that one line; ``destroy_process_group()`` of the default group leaves it there (the next cell's
collectives need it) and says so. Every rank prints the same line, so the notebook shows it once.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

STARTED_BY = "started by %neuron ranks"
SKIPPED = f"neuron_lab: the process group already exists ({STARTED_BY}): this call was skipped"
KEPT = (f"neuron_lab: the process group stays ({STARTED_BY}; `%neuron ranks stop` ends it): "
        "destroy_process_group() was skipped")

_originals: dict[str, Callable[..., Any]] = {}  # torch's own functions while ours stand in for them


class ProcessGroupExists(ValueError):
    """``init_process_group`` asked for a default group other than the one the ranks are in."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows this line instead of a traceback into torch: the cell's call is the whole story."""
        return [f"{type(self).__name__}: {self}"]


def keep() -> None:
    """From now on, calls in this process that would make the default group again or destroy it meet the group
    that exists (idempotent)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if _originals:
        return
    _originals.update(init_process_group=c10d.init_process_group, destroy_process_group=c10d.destroy_process_group)
    init, destroy = _init(_originals["init_process_group"]), _destroy(_originals["destroy_process_group"])
    for module in (dist, c10d):
        module.init_process_group, module.destroy_process_group = init, destroy


def release() -> None:
    """torch's own functions back (``%neuron ranks stop``, before the rank leaves the group)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name, fn in _originals.items():
        for module in (dist, c10d):
            setattr(module, name, fn)
    _originals.clear()


def _init(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return original(*args, **kwargs)
        asked = signature.bind(*args, **kwargs).arguments
        differs = _differs(asked, str(dist.get_backend()), dist.get_world_size(), dist.get_rank())
        if differs:
            raise ProcessGroupExists(
                f"the process group already exists ({STARTED_BY}: backend {dist.get_backend()}, world size "
                f"{dist.get_world_size()}), not {differs}; dist.new_group() makes another group on these ranks")
        print(SKIPPED, file=sys.stderr)
        return None

    return init_process_group


def _differs(asked: dict[str, Any], backend: str, world_size: int, rank: int) -> str:
    """What of the call's arguments would make a group other than the one that exists ("" when none would)."""
    out = []
    wanted = asked.get("backend")
    if wanted is not None and not _same_backend(str(wanted).lower(), backend):
        out.append(f"backend {wanted!r}")
    if asked.get("world_size", -1) not in (-1, world_size):
        out.append(f"world size {asked['world_size']}")
    if asked.get("rank", -1) not in (-1, rank):
        out.append(f"rank {asked['rank']} (this is rank {rank})")
    return " and ".join(out)


def _same_backend(wanted: str, backend: str) -> bool:
    """``neuron``, or a per-device string whose ``neuron`` devices use it (``cpu:gloo,neuron:neuron``)."""
    if ":" not in wanted:
        return wanted == backend
    return dict(part.partition(":")[::2] for part in wanted.split(",")).get("neuron") == backend


def _destroy(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        import torch.distributed as dist

        if group is not None and group is not dist.GroupMember.WORLD:  # a group the cell made: the cell's to end
            return original(group)
        print(KEPT, file=sys.stderr)
        return None

    return destroy_process_group
