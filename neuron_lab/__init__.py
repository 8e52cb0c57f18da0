"""neuron_lab: a Jupyter-first workbench for PyTorch on AWS Trainium (TorchNeuron).

Importing it makes the `neuron` device available even where PyTorch's backend autoload is off
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): the real TorchNeuron when installed, else the emulator.
"""

from __future__ import annotations

__version__ = "0.1.0"

import torch  # noqa: E402,F401  (first: PyTorch's autoload may call back into neuron_lab.backend)

from neuron_lab import backend as backend  # noqa: E402

backend.activate()  # never raises: problems become warnings and stay in backend.state() for `doctor`


def load_ipython_extension(ipython) -> None:
    """``%load_ext neuron_lab``: the `%neuron` magics, per-cell reports and ``%config NeuronLab``."""
    from neuron_lab import extension

    extension.load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext neuron_lab``: undo everything loading did."""
    from neuron_lab import extension

    extension.unload(ipython)


def track(**kwargs):
    """``with neuron_lab.track() as report: ...``: the per-cell report for a block of a script or test."""
    from neuron_lab.trace import track as _track

    return _track(**kwargs)
