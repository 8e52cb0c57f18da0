"""Device-to-host syncs: which read a cell forced (``.item()``, print, ``.tolist()``, a copy to the CPU, a
data-dependent shape), named from the op that read and the Python call that asked for it.

Both cores report the op (``aten::_local_scalar_dense``, a copy to the CPU, ``aten::nonzero``) only while a
subscriber wants :data:`~neuron_lab.kinds.SYNC`; this module names the read. A sync stalls the device, so looking
at the caller's frame here costs nothing next to what it stands for.
"""

from __future__ import annotations

import dis
import os
import sys
from types import CodeType, FrameType

from torch import Tensor

from neuron_lab.backend.events import OpEvent, OpRecorder
from neuron_lab.kinds import SYNC

ITEM = "item"  # aten::_local_scalar_dense: .item(), float(t), int(t), bool(t) (an `if` on a device tensor)
PRINT = "print"  # print(t), repr(t), f"{t}": torch's formatter reads the values
TOLIST = "tolist"
CPU_COPY = "cpu copy"  # .cpu(), .to("cpu"), .numpy() after it, a copy_ into a CPU tensor
DATA_DEPENDENT = "data-dependent shape"  # nonzero, masked_select, unique: the result's size is read back
REASONS = {  # each reason's words, the row's "why"
    ITEM: "`.item()`, or `float()`/`int()`/`bool()` of a device tensor (an `if` on one), reads a value back "
          "(aten::_local_scalar_dense)",
    PRINT: "printing a device tensor: torch's formatter reads its values back, several reads a print",
    TOLIST: "`.tolist()` copies the tensor to the host",
    CPU_COPY: "`.cpu()`, `.to(\"cpu\")` or a copy into a CPU tensor copies the tensor to the host",
    DATA_DEPENDENT: "the result's size depends on the values (nonzero, masked_select, unique): the host reads them "
                    "before it can size the result",
}

# Ops whose result's shape depends on the values (a mask's count, the distinct values): on a device the host must
# read the data back before it can size the result, so each call is a sync. Both cores and the TorchNeuron
# observer read this set.
DATA_DEPENDENT_OPS = frozenset({"aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2",
                                "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive"})
_OURS = os.path.dirname(__file__)  # the cores' own Python frames, skipped to reach the caller
# torch's frames between a Python kernel (or TorchNeuron's dispatch-mode observer) and its caller
_DISPATCH = ("torch/_ops.py", "torch/library.py", "torch/utils/_python_dispatch.py")
_FORMATTER = "_tensor_str.py"  # torch/_tensor_str.py: every print, repr and format of a tensor
_called: dict[tuple[CodeType, int], str] = {}  # (code, instruction) -> the attribute it calls


def _called_name(frame: FrameType) -> str:
    """The method name the frame is calling at its current instruction (``tolist``, ``cpu``), or ""."""
    key = (frame.f_code, frame.f_lasti)
    name = _called.get(key)
    if name is None:
        name = ""
        for ins in dis.get_instructions(frame.f_code):
            if ins.offset > frame.f_lasti:
                break
            if ins.opname in ("LOAD_METHOD", "LOAD_ATTR"):
                name = str(ins.argval)
        _called[key] = name
    return name


def reason(op: str, frame: FrameType | None) -> str:
    """Which of the :data:`REASONS` a read of ``op`` is, from the Python frames calling it (innermost first)."""
    f = frame
    while f is not None:
        if f.f_code.co_filename.endswith(_FORMATTER):
            return PRINT
        f = f.f_back
    if op == "aten::_local_scalar_dense":
        return ITEM
    if op in ("aten::copy_", "aten::_to_copy"):
        return TOLIST if frame is not None and _called_name(frame) == "tolist" else CPU_COPY
    return DATA_DEPENDENT


def _caller(frame: FrameType | None) -> FrameType | None:
    """The innermost frame that is neither a core's nor torch's dispatch: what asked for the read."""
    while frame is not None and (frame.f_code.co_filename.startswith(_OURS)
                                 or frame.f_code.co_filename.endswith(_DISPATCH)):
        frame = frame.f_back
    return frame


def emit(recorder: OpRecorder, op: str, t: Tensor) -> None:
    """Hand a read of ``op`` on ``t`` to whoever wants syncs (nothing is made otherwise)."""
    if recorder.wants(SYNC):
        recorder.emit(event(op, (tuple(t.shape),), (str(t.dtype).removeprefix("torch."),)))


def event(op: str, shapes: tuple = (), dtypes: tuple = ()) -> OpEvent:
    """The sync event for a read of ``op``: named by its reason (a line's rows split by it)."""
    why = reason(op, _caller(sys._getframe(1)))
    return OpEvent(why, "", SYNC, REASONS[why], shapes, dtypes, 0)
