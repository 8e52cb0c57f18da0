"""Calls that a public report saw abort the process on TorchNeuron, flagged before they run.

A coverage's ``aborts`` table names ops that killed Python (SIGABRT or SIGSEGV) when applied to a parameter
(``coverage/evidence/torchneuron-aborts.json``). Both cores call :func:`check` only for an op in that table (the
compiled core marks those ops' plans; no other op pays for it); :func:`check` looks for a ``torch.nn.Parameter``
argument and then does what ``NEURON_LAB_ABORTS`` says: ``warn`` (the default) hands an ``abort`` row to the report
and warns once per op and line, ``raise`` stops the call before it runs, ``off`` says nothing.
"""

from __future__ import annotations

import sys
import warnings

from torch import Tensor
from torch.nn import Parameter

from neuron_lab import frames, settings
from neuron_lab.backend.emulator import runtime
from neuron_lab.backend.events import OpEvent, signature_of
from neuron_lab.kinds import ABORT, SOURCE

_MODE = settings.env("NEURON_LAB_ABORTS")
MESSAGE = ("{op} on a parameter at {line} may abort the process on TorchNeuron: {why} "
           "({var}=raise stops it before it runs, {var}=off silences it)")
_warned: set[tuple[str, str, int]] = set()  # (op, file, line) already warned about


class AbortRiskWarning(UserWarning):
    """An op a public report saw abort the process on TorchNeuron ran on a parameter (``NEURON_LAB_ABORTS=warn``)."""


class AbortRiskError(RuntimeError):
    """The same call refused before it runs (``NEURON_LAB_ABORTS=raise``)."""


def _has_parameter(args: tuple, kwargs: dict) -> bool:
    """Whether a parameter is among the arguments (or in a tensor list). ``nn.Parameter``'s isinstance is Python
    code, so it is asked of tensors only: most arguments of these ops are sizes."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            if a and isinstance(a[0], Tensor) and any(isinstance(b, Parameter) for b in a):
                return True
        elif isinstance(a, Tensor) and isinstance(a, Parameter):
            return True
    return False


def _user_line() -> tuple[str, int]:
    """The innermost line outside torch, neuron_lab and the standard library: the user's (or a library's) call."""
    f = sys._getframe(2)
    while f is not None and frames.is_internal(f.f_code.co_filename):
        f = f.f_back
    return (frames.shown_path(f.f_code.co_filename), f.f_lineno) if f is not None else ("<unknown>", 0)


def check(name: str, overload: str, args: tuple, kwargs: dict | None = None) -> None:
    """Flag a call of ``name`` (an op of the coverage's ``aborts``) when a parameter is among its arguments."""
    kwargs = kwargs or {}
    if not _has_parameter(args, kwargs):
        return
    rt = runtime.get()
    rule = rt.coverage.abort_rule(name)
    if rule is None:
        return
    mode, _ = _MODE.choice()
    if mode == "off":
        return
    file, line = _user_line()
    why, _, source = rule.reason.partition(SOURCE)
    text = MESSAGE.format(op=name, line=f"{file}:{line}", why=f"{why} (sources: {source})" if source else why,
                          var=_MODE.name)
    if mode == "raise":
        raise AbortRiskError(text)
    if (name, file, line) not in _warned:
        _warned.add((name, file, line))
        warnings.warn_explicit(text, AbortRiskWarning, file, line)
    if rt.recorder.wants(ABORT):
        shapes, dtypes = signature_of(args, kwargs)
        rt.recorder.emit(OpEvent(name, overload, ABORT, rule.shown, shapes, dtypes, 0), args)
