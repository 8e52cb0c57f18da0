"""The checks from plain Python: ``neuron_lab.parity(fn, *args)`` and ``neuron_lab.compare(fn, *args)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab.checks import compare as _compare
from neuron_lab.checks import parity as _parity
from neuron_lab.checks.compare import CompareOptions
from neuron_lab.checks.parity import ParityOptions, device_of
from neuron_lab.checks.runs import FunctionSubject
from neuron_lab.report.checks import CompareResult, ParityResult
from neuron_lab.trace.sites import FileLocator


def parity(fn: Callable, *args: Any, against: str | torch.device = "cpu", rtol: float | None = None,
           atol: float | None = None, seed: int | None = None, _keep: Callable[[Any], None] | None = None,
           **kwargs: Any) -> ParityResult:
    """Run ``fn(*args, **kwargs)`` as given (the device run), then on copies of its arguments moved to
    ``against``; compare the return value and the arguments (a model trained in place, an optimizer).

    Returns the :class:`ParityResult`; if the device run raises, that exception propagates.
    ``_keep`` gets the result as soon as it exists (also when that happens).
    Bad options raise a ``ValueError`` before anything runs.
    """
    __tracebackhide__ = True  # noqa: F841
    options = ParityOptions(against, rtol, atol, (), seed)
    subject = FunctionSubject(fn, args, kwargs)
    device = device_of(subject.namespace, torch.device("cpu"))
    if device == options.against:
        raise ValueError(f"parity needs the arguments on another device than the reference ({options.against}); "
                         f"move them first, e.g. .to('neuron')")
    return _parity.check(subject, device, options, locator=FileLocator(), keep=_keep)


def compare(fn: Callable, *args: Any, warmup: int = 1, runs: int = 5, fullgraph: bool = False,
            backend: str | None = None, _keep: Callable[[Any], None] | None = None, **kwargs: Any) -> CompareResult:
    """Time ``fn(*args, **kwargs)`` eagerly and compiled (``torch.compile(fn)``, or compile mode for an
    ``nn.Module``), each on fresh copies of the arguments, and compare their outputs. The arguments
    are left as they were. Bad options raise a ``ValueError`` before anything runs."""
    options = CompareOptions(warmup, runs, fullgraph, backend or ("neuron" if _backend.is_active() else "inductor"))
    subject = FunctionSubject(fn, args, kwargs)
    device = device_of(subject.namespace, torch.device("cpu"))
    return _compare.check(subject, device, options, locator=FileLocator(), keep=_keep)
