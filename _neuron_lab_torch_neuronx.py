"""Lets ``import torch_neuronx`` be the first import of a process where neuron_lab emulates it.

``neuron_lab-torch_neuronx.pth``, installed beside this module, imports it at interpreter start-up. It adds one
finder at the end of ``sys.meta_path`` and imports nothing else, so a process that never asks for
``torch_neuronx`` pays one list append. When something asks and no real torch-neuronx was found first, it
imports torch and neuron_lab (which installs the backend and, when that is the emulator, the finder that serves
the emulated ``torch_neuronx``), hands over to that finder and leaves ``sys.meta_path``.
"""

from __future__ import annotations

import sys
from typing import Any


class NeuronLabStartupFinder:
    """Reached only after every other finder came back empty for ``torch_neuronx``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch_neuronx":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: from now on neuron_lab's own finder answers, or nobody
        import torch  # noqa: F401  (PyTorch's backend autoload activates neuron_lab)

        import neuron_lab  # noqa: F401  (and so does this, with TORCH_DEVICE_BACKEND_AUTOLOAD=0)

        for finder in sys.meta_path:
            if type(finder).__name__ == "EmulatedNeuronxFinder":
                return finder.find_spec(fullname, path, target)
        return None  # the real TorchNeuron backend, or none: no emulation to serve


if not any(type(f).__name__ == NeuronLabStartupFinder.__name__ for f in sys.meta_path):
    sys.meta_path.append(NeuronLabStartupFinder())
