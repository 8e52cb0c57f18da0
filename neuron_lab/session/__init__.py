"""Per-shell workbench state over the trace layer; needs an IPython shell object, never a frontend."""

from neuron_lab.session.config import NeuronLab, settings_of
from neuron_lab.session.session import Session, Status

__all__ = ["NeuronLab", "Session", "Status", "settings_of"]
