"""The fake's Neuron runtime: started by the first device use, never by importing the package.

Mirrors tnx torch_neuronx/__init__.py:137-183: ``_lazy_init`` runs ``nrt_init`` once; ``get_device_properties``
(:236) and every device allocation (tnx csrc/aten/NeuronNativeFunctions.cpp:252, ``maybe_lazy_init``) start it;
``is_neuron_runtime_initialized`` is False until then. Fake-only: with ``FAKE_NRT_HELD=1`` in the environment,
``nrt_init`` fails as it does when another process holds the NeuronCores (tnx csrc/core/NeuronBindings.cpp:271).
"""

from __future__ import annotations

import os

HELD_ENV = "FAKE_NRT_HELD"
_initialized = False


def lazy_init() -> None:
    global _initialized
    if _initialized:
        return
    if os.environ.get(HELD_ENV) == "1":
        raise RuntimeError("Failed to initialize Neuron Runtime: status code 1")
    _initialized = True


def is_initialized() -> bool:
    return _initialized
