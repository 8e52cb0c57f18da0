"""A gloo work waited for so that an interrupt ends the wait: a rank whose peers never come is freed by a SIGINT.

c10d's ``Work.wait()`` blocks in C++ (GIL released) until the work completes or the group's timeout passes, and a
SIGINT's Python handler runs only once it returns: the kernel's interrupt and ``%neuron ranks interrupt`` would not
reach a rank stuck in a collective. So the wait goes in slices (``Work.wait(timeout)``, whose passing c10d raises
as "Operation timed out!"); between two slices Python runs its signal handlers, and the KeyboardInterrupt lands.
Collectives only: gloo's point-to-point works (send, recv) have their own timed wait, which a passed slice breaks.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

SLICE = timedelta(milliseconds=100)  # how soon an interrupt ends a waiting collective, at the latest
_SLICE_PASSED = "Operation timed out!"  # c10d's words when a slice passed; gloo's own timeout says other words


def wait(work: dist.Work) -> bool:
    """``work.wait()``, in :data:`SLICE` slices (the group's timeout still ends it, with gloo's error). A work done
    already is waited for as it is (a work made from a future, as a coalesced call's parts are, takes no timeout)."""
    if work.is_completed():
        return work.wait()
    while True:
        try:
            return work.wait(SLICE)
        except RuntimeError as e:
            if _SLICE_PASSED not in str(e):
                raise
