"""neuron_lab: a Jupyter-first workbench for PyTorch on AWS Trainium (TorchNeuron).

Importing it makes the `neuron` device available even where PyTorch's backend autoload is off
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): the real TorchNeuron when installed, else the emulator
(``neuron-lab doctor`` says which, and why). ``%load_ext neuron_lab`` is the notebook's entry point;
``track()``, ``profile()``, ``parity()`` and ``compare()`` do in a script or test what the magics do
in a cell, ``last_profile()`` exports the newest profile's trace afterwards, and ``dashboard()`` shows the live views.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from neuron_lab._version import __version__ as __version__

if TYPE_CHECKING:  # the modules behind the API load when it is first called, not at `import neuron_lab`
    from IPython.core.interactiveshell import InteractiveShell

    from neuron_lab.report.checks import CheckResult, CompareResult, ParityResult
    from neuron_lab.report.model import Report
    from neuron_lab.trace.profile import ProfileResult
    from neuron_lab.trace.sites import Locator

# `python -m neuron_lab` imports this package before running its __main__, which reads the command line first, as the
# console script does (_neuron_lab_cli.py), and runs this module again for a command that uses the device. While
# Python looks for the module `-m` names, sys.argv[0] is "-m" (as its docs say); the name is the word before the
# arguments.
_COMMAND_LINE_FIRST = sys.argv[:1] == ["-m"] and sys.orig_argv[-len(sys.argv)] in ("neuron_lab", "-mneuron_lab")
if not _COMMAND_LINE_FIRST:
    import torch  # noqa: F401  (first: PyTorch's autoload may call back into neuron_lab.backend)

    from neuron_lab import backend as backend

    backend.activate()  # never raises: problems become warnings and stay in backend.state() for `doctor`


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """``%load_ext neuron_lab``: the `%neuron` magics, per-cell reports and ``%config NeuronLab``."""
    from neuron_lab import extension

    extension.load(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """``%unload_ext neuron_lab``: undo everything loading did."""
    from neuron_lab import extension

    extension.unload(ipython)


def track(*, callsites: bool = True, stack_limit: int = 3,
          locator: Locator | None = None) -> AbstractContextManager[Report]:
    """``with neuron_lab.track() as report: ...``: the per-cell report for a block of a script or test."""
    from neuron_lab.trace.tracker import track as _track

    return _track(callsites=callsites, stack_limit=stack_limit, locator=locator)


def profile(*, export: str | None = None, row_limit: int = 10) -> AbstractContextManager[Report]:
    """``with neuron_lab.profile(export="trace.json") as report: ...``: the block runs under torch.profiler; its report
    adds each op's device and host time and the line that issued it, and the time per line (``%%neuron profile``)."""
    from neuron_lab.trace.profile import profile as _profile

    return _profile(export=export, row_limit=row_limit)


def last_profile() -> ProfileResult:
    """The newest profile of this process (a ``%%neuron profile`` cell's, a ``neuron_lab.profile()`` block's), after
    the fact: ``neuron_lab.last_profile().export_chrome_trace("trace.json")``, ``.table()``, ``.key_averages()``.
    RuntimeError when nothing was profiled yet."""
    from neuron_lab.trace.profile import last_profile as _last_profile

    return _last_profile()


def dashboard(views: Iterable[str] | None = None) -> Any:
    """The live dashboard (memory, tensors, fallbacks, compiles) for the current IPython session.

    Make it a cell's value, or ``display()`` it. Loads the extension if it is not loaded yet.
    """
    from IPython import get_ipython

    from neuron_lab import extension, widgets

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("neuron_lab.dashboard() needs IPython or Jupyter; in a script use neuron_lab.track()")
    if extension.session_of(shell) is None:
        extension.load(shell)
    return widgets.show(extension.session_of(shell), tuple(views) if views else widgets.VIEWS)


def parity(fn: Callable[..., Any], *args: Any, against: str | torch.device = "cpu", rtol: float | None = None,
           atol: float | None = None, seed: int | None = None, **kwargs: Any) -> ParityResult:
    """Run ``fn(*args, **kwargs)`` as given, then on copies of its arguments on ``against``, and compare what each
    run produced (``%%neuron parity``)."""
    from neuron_lab.checks import api

    return api.parity(fn, *args, against=against, rtol=rtol, atol=atol, seed=seed, _keep=_keep_in_cell, **kwargs)


def compare(fn: Callable[..., Any], *args: Any, warmup: int = 1, runs: int = 5, fullgraph: bool = False,
            backend: str | None = None, **kwargs: Any) -> CompareResult:
    """Time ``fn(*args, **kwargs)`` eager and compiled on copies of its arguments and compare their outputs
    (``%%neuron compare``)."""
    from neuron_lab.checks import api

    return api.compare(fn, *args, warmup=warmup, runs=runs, fullgraph=fullgraph, backend=backend,
                       _keep=_keep_in_cell, **kwargs)


def _keep_in_cell(result: CheckResult) -> None:
    """Called from inside a notebook cell, a check's result joins that cell's report too."""
    import sys

    if "neuron_lab.extension" not in sys.modules:
        return
    from IPython import get_ipython

    from neuron_lab.extension import session_of

    shell = get_ipython()
    session = session_of(shell) if shell is not None else None
    if session is not None and session.running is not None:
        session.running.keep(result)
