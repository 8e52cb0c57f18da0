"""Names of TorchNeuron's API the emulator has no meaning for yet: they exist, and calling one says so plainly.

An ``AttributeError`` would read as a typo or a version mismatch; this error says that the name is right,
that the emulator does not do it yet, and that a Trn instance does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NotEmulatedError(NotImplementedError):
    """A TorchNeuron name that neuron_lab's emulator does not emulate yet."""


def not_emulated(qualname: str, why: str) -> Callable[..., Any]:
    """A stand-in for ``qualname`` whose every call raises :class:`NotEmulatedError` with ``why``."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotEmulatedError(f"{qualname} is not emulated yet by neuron_lab ({why}); on a Trn instance the real "
                               "torch-neuronx provides it")

    stand_in.__name__ = stand_in.__qualname__ = qualname.rpartition(".")[2]
    stand_in.__doc__ = f"Not emulated yet: {why}."
    return stand_in
