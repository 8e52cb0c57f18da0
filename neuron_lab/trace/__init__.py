"""Backend-agnostic observation of a window of work: op events, call sites, compile events, memory.

It knows the backend interface and dynamo, nothing of IPython or widgets; a notebook session
passes in a :class:`~neuron_lab.trace.sites.Locator` that knows which code objects are cells. Its modules are
imported by name (``neuron_lab.trace.tracker``): the runner's process reads ``merge`` without the device's stack.
"""
