"""What the emulator raises where it cannot serve a TorchNeuron name (``wrap_nki`` without AWS's ``nki``).

An ``AttributeError`` would read as a typo or a version mismatch; this error says that the name is right,
that the emulator cannot do it here, and that a Trn instance does.
"""

from __future__ import annotations


class NotEmulatedError(NotImplementedError):
    """A TorchNeuron name that neuron_lab's emulator does not emulate yet."""
