"""After the device's out-of-memory error: a traceback that ends in the user's code, what filled the device, and
the memory given back.

IPython's own hook for one exception type (``set_custom_exc``) shows ``torch.OutOfMemoryError`` with neuron_lab's
frames cut off the end of its traceback: it ends where it would on the device, in the user's code (or torch's),
never in the emulator's allocator. Cut frames free their locals at once. Once the cell's report has listed what held
the device, the locals of the failing functions' frames are cleared too, so a tensor that only the traceback kept
alive does not hold device memory until the next error (``%neuron free`` used to be the only way out).
``%config NeuronLab.oom_traceback = 'full'`` keeps the whole traceback and its frames, for ``%debug``.
"""

from __future__ import annotations

import gc
import os
import re
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.report.model import HeldTensor, OutOfMemory
from neuron_lab.session import free, tensors

TOP = 5  # holders listed; the rest is one line
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the neuron_lab package
_LIBRARY = (_OURS, os.path.dirname(torch.__file__) + os.sep)
_INDEX = re.compile(r"\[\d+\]")
# TorchNeuron's allocator throws std::runtime_error, a RuntimeError in Python
# (csrc/core/allocator/NeuronCachingAllocator.cpp:82-88)
_NRT_OOM = re.compile(r"NRT allocation failed for size \d+ \(OOM\)")


def is_oom(error: BaseException | None) -> bool:
    """Whether ``error`` says the device ran out of memory: the emulator's ``torch.OutOfMemoryError``, or TorchNeuron's
    ``RuntimeError("NRT allocation failed for size N (OOM)")`` (raised at the allocation, or at a later sync point)."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError)
                                                         and _NRT_OOM.search(str(error)) is not None)


def end_in_user_code(tb: Any) -> None:
    """Cut neuron_lab's frames off the end of ``tb``, in place: after the last frame of the user's (neither torch's
    nor neuron_lab's) the traceback stops at the first of neuron_lab's; torch's frames before it stay."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    files = [t.tb_frame.f_code.co_filename for t in frames]
    user = max((i for i, f in enumerate(files) if not f.startswith(_LIBRARY)), default=-1)
    ours = next((i for i in range(user + 1, len(files)) if files[i].startswith(_OURS)), None)
    if ours is not None and ours > 0:
        frames[ours - 1].tb_next = None


class OomHandler:
    """Installs itself as the shell's handler of ``torch.OutOfMemoryError`` unless another one is set."""

    def __init__(self, shell: Any, settings: Any) -> None:
        self.shell = shell
        self.settings = settings
        self._before: tuple[Any, Any] | None = None

    def install(self) -> None:
        sh = self.shell
        if sh.custom_exceptions:  # the user's (or another extension's) handler: IPython keeps one
            return
        self._before = (sh.custom_exceptions, sh.CustomTB)
        sh.set_custom_exc((torch.OutOfMemoryError,), self._show)

    def uninstall(self) -> None:
        if self._before is not None and self.shell.custom_exceptions == (torch.OutOfMemoryError,):
            self.shell.custom_exceptions, self.shell.CustomTB = self._before
        self._before = None

    @property
    def short(self) -> bool:
        return self.settings.oom_traceback == "short"

    def _show(self, shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        if self.short:
            end_in_user_code(tb)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)  # sets sys.last_*: %tb and %debug work

    def after(self) -> OutOfMemory:
        """What held the device once the error unwound; then, with short tracebacks, the failing frames' locals
        cleared and the bytes that gave back."""
        table = tensors.device_tensors(self.shell)
        report = OutOfMemory(table.allocated, *_top(table.rows))
        if self.short:
            b = _backend.active()
            free.clear_traceback_frames(self.shell, b.device_type, free.FreeReport())
            gc.collect()
            report.freed = max(table.allocated - b.allocated_everywhere(), 0)
        return report


def _top(rows: list[tensors.TensorRow]) -> tuple[list[HeldTensor], int]:
    """The ``TOP`` biggest holders (the items of one list or dict as one), and the bytes of the rest."""
    groups: dict[tuple, list[tensors.TensorRow]] = {}
    for r in rows:
        name = _INDEX.sub("[…]", r.names[0]) if r.names else ""
        groups.setdefault((r.held_by, name, r.shape, r.dtype), []).append(r)
    held = []
    for (held_by, name, shape, dtype), rs in groups.items():
        names = tuple(rs[0].names[:3]) if len(rs) == 1 else (name,)
        held.append(HeldTensor(names, shape, dtype, sum(r.bytes for r in rs), len(rs), held_by))
    held.sort(key=lambda h: (-h.bytes, h.names))
    return held[:TOP], sum(h.bytes for h in held[TOP:])
