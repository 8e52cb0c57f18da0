"""Per-shell workbench state over the trace layer; needs an IPython shell object, never a frontend.

Its modules are imported by name (``neuron_lab.session.session``): a launcher's process reads a few of them
(launch, placement) without the device's stack, which ``session.session`` brings in."""
