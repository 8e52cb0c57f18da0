"""After the device's out-of-memory error: the short answer first (what was asked, what was free, what held the
device, in the user's names), then a traceback that ends in the user's code, and the memory given back.

IPython's own hook for one exception type (``set_custom_exc``) shows ``torch.OutOfMemoryError``: it displays the
answer, then the traceback with ``torch.nn.Module``'s call plumbing skipped and the frames after the user's last line
(torch's, the emulator's allocator) cut off. Cut frames free their locals at once. Once the cell's report has listed
what held the device, the locals of the failing functions' frames are cleared too, so a tensor that only the
traceback kept alive does not hold device memory until the next error (``%neuron free`` used to be the only way out).
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
_LIBRARY = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # neuron_lab, and torch
            os.path.dirname(torch.__file__) + os.sep)
_INDEX = re.compile(r"(?<!In)\[\d+\]")  # an item of a list, not a cell's number
_MODULE_CALLS = {torch.nn.Module._wrapped_call_impl.__code__, torch.nn.Module._call_impl.__code__}
# TorchNeuron's allocator throws std::runtime_error, a RuntimeError in Python
# (csrc/core/allocator/NeuronCachingAllocator.cpp:82-88)
_NRT_OOM = re.compile(r"NRT allocation failed for size \d+ \(OOM\)")


def is_oom(error: BaseException | None) -> bool:
    """Whether ``error`` says the device ran out of memory: the emulator's ``torch.OutOfMemoryError``, or TorchNeuron's
    ``RuntimeError("NRT allocation failed for size N (OOM)")`` (raised at the allocation, or at a later sync point)."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError)
                                                         and _NRT_OOM.search(str(error)) is not None)


def end_in_user_code(tb: Any) -> None:
    """Cut the frames after the last of the user's (neither torch's nor neuron_lab's) off ``tb``, in place: the
    traceback ends at the user's line that asked for the memory; the holder table already named what torch's frames
    held, in the user's terms."""
    last = None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_LIBRARY):
            last = tb
        tb = tb.tb_next
    if last is not None:
        last.tb_next = None


def skip_module_calls(tb: Any) -> None:
    """Unlink ``torch.nn.Module``'s call plumbing (``_wrapped_call_impl``, ``_call_impl``: 16 lines a module) from
    ``tb``, in place: ``x = block(x)`` is followed by ``Block.forward``. The skipped frames' locals (the call's
    arguments, which ``forward`` holds too) are cleared, since nothing shows or scans them any more."""
    prev = None
    while tb is not None:
        if prev is not None and tb.tb_frame.f_code in _MODULE_CALLS:
            prev.tb_next = tb.tb_next
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still running (a traceback taken inside the call)
                pass
        else:
            prev = tb
        tb = tb.tb_next


class OomHandler:
    """Installs itself as the shell's handler of ``torch.OutOfMemoryError`` unless another one is set."""

    def __init__(self, shell: Any, settings: Any) -> None:
        self.shell = shell
        self.settings = settings
        self._before: tuple[Any, Any] | None = None
        self._answer: OutOfMemory | None = None  # shown above the traceback; the cell's report takes it

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
        """The short answer (asked, free, what held the device) first, then the traceback under it."""
        if self.short:
            skip_module_calls(tb)
        if _backend.is_active():
            self._answer = self._held(value, [tb])
            data, metadata = shell.display_formatter.format(self._answer)  # IPython's display(), from its shell
            shell.display_pub.publish(data=data, metadata=metadata)
        if self.short:
            end_in_user_code(tb)  # once the scan has named what the cut frames held
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)  # sets sys.last_*: %tb and %debug work

    def _held(self, error: BaseException, tracebacks: list[Any] | None = None) -> OutOfMemory:
        b = _backend.active()
        table = tensors.device_tensors(self.shell, tracebacks)
        capacity = b.capacity()
        free = None if capacity is None else max(capacity - b.memory_reading().reserved, 0)
        return OutOfMemory(table.allocated, *_top(table.rows), asked=b.oom_asked(error), free=free)

    def after(self, error: BaseException) -> OutOfMemory:
        """What held the device once the error unwound (as shown above the traceback, where it was); then, with
        short tracebacks, the failing frames' locals cleared and the bytes that gave back."""
        report, self._answer = self._answer or self._held(error), None
        if self.short:
            b = _backend.active()
            free.clear_traceback_frames(self.shell, b.device_type, free.FreeReport())
            gc.collect()
            report.freed = max(report.allocated - b.allocated_everywhere(), 0)
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
