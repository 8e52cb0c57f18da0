"""``import torch_neuronx`` on the emulator: a ``sys.meta_path`` finder that serves the emulated package.

It is appended to ``sys.meta_path``, so the import system asks it only after every other finder came back
empty: a real torch-neuronx anywhere on ``sys.path`` always wins, and nothing is served twice. There are no
files on ``sys.path`` and no distribution metadata, so pip, ``importlib.metadata`` and neuron_lab's own
backend selection (which reads that metadata) see no torch-neuronx. transformers and accelerate decide that
a `neuron` device exists with ``importlib.util.find_spec("torch_neuronx")``; this is what answers it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

NAME = "torch_neuronx"
PACKAGE = Path(__file__).with_name("neuronx")  # the emulated package's sources, served under NAME


class EmulatedNeuronxFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch_neuronx`` (its submodules are then found through the package's ``__path__``)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != NAME:
            return None
        return importlib.util.spec_from_file_location(NAME, PACKAGE / "__init__.py",
                                                      submodule_search_locations=[str(PACKAGE)])

    def __repr__(self) -> str:
        return "<neuron_lab emulation of torch_neuronx>"


def install() -> None:
    """Serve ``torch_neuronx`` from now on (idempotent)."""
    if not any(isinstance(f, EmulatedNeuronxFinder) for f in sys.meta_path):
        sys.meta_path.append(EmulatedNeuronxFinder())


def serving() -> bool:
    """Whether ``import torch_neuronx`` gives (or would give) the emulated package."""
    spec = importlib.util.find_spec(NAME) if NAME not in sys.modules else sys.modules[NAME].__spec__
    return spec is not None and spec.origin == str(PACKAGE / "__init__.py")
