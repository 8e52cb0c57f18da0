"""Which of TorchNeuron's settings torch_neuronx set itself, and its build type, for ``neuron-lab doctor``.

Importing torch_neuronx ``setdefault``s a few variables, two of them from its build type (tnx
torch_neuronx/__init__.py:44-65; _build_config.py: RELEASE or DEV), so a value doctor shows may be TorchNeuron's
and not the user's. :func:`record_before_import` keeps the values from before neuron_lab imports it; when
TorchNeuron's own autoload imported it first, a value equal to its import default is said to be that default.
"""

from __future__ import annotations

import importlib
import sys

from neuron_lab import settings

# name -> the value torch_neuronx's import sets when it is unset, or the _build_config name that holds it
IMPORT_DEFAULTS = {
    "NEURON_LAUNCH_BLOCKING": "DEFAULT_SYNC_MODE",  # tnx __init__.py:46
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "DEFAULT_FALLBACK_ONLY_FOR_UNIMPLEMENTED",  # :47-49
    "TORCH_NEURONX_ENABLE_ASYNC_NRT": "1",  # :62
    "TORCH_NEURONX_ENABLE_STACK_TRACE": "0",  # :65
}
# Without a _build_config (an editable install) the import uses its DEV defaults (tnx __init__.py:33-37).
_NO_BUILD_CONFIG = {"DEFAULT_SYNC_MODE": "0", "DEFAULT_FALLBACK_ONLY_FOR_UNIMPLEMENTED": "1"}
_before: dict[str, str | None] | None = None


def record_before_import() -> None:
    """Keep the variables torch_neuronx may set, if it is not imported yet (called just before importing it)."""
    global _before
    if _before is None and "torch_neuronx" not in sys.modules:
        _before = {name: settings.env(name).raw() for name in IMPORT_DEFAULTS}


def _build_config():
    try:
        return importlib.import_module("torch_neuronx._build_config")
    except Exception:  # an editable install has none; any failure only means "not known"
        return None


def build_type() -> str | None:
    """``torch_neuronx._build_config.BUILD_TYPE`` (RELEASE or DEV) where the loaded package has one."""
    if "torch_neuronx" not in sys.modules:
        return None
    return getattr(_build_config(), "BUILD_TYPE", None)


def import_default(name: str) -> str | None:
    """The value torch_neuronx's import gives ``name`` when it is unset; None for the variables it leaves alone."""
    default = IMPORT_DEFAULTS.get(name)
    if default is None or not default.startswith("DEFAULT_"):
        return default
    return str(getattr(_build_config(), default, _NO_BUILD_CONFIG[default]))


def who_set(name: str) -> str:
    """"set by torch_neuronx at import", "torch_neuronx's import default", or "" (the user's, or unset)."""
    value = settings.env(name).raw()
    if value is None or name not in IMPORT_DEFAULTS or "torch_neuronx" not in sys.modules:
        return ""
    if _before is not None:
        return "set by torch_neuronx at import" if _before[name] is None else ""
    return "torch_neuronx's import default" if value == import_default(name) else ""
