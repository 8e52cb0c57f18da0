"""The package's version, from its installed metadata (pyproject.toml is the one place it is written)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("neuron_lab")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"
