"""Backend-agnostic observation of a window of work: op events, call sites, compile events, memory.

It knows the backend interface and dynamo, nothing of IPython or widgets; a notebook session
passes in a :class:`~neuron_lab.trace.sites.Locator` that knows which code objects are cells.
"""

from neuron_lab.trace.sites import FileLocator, Locator
from neuron_lab.trace.tracker import Tracker, track

__all__ = ["FileLocator", "Locator", "Tracker", "track"]
