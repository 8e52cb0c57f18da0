"""``python -m neuron_lab``: the console script's commands, its command line read before torch loads as there.

Python imports the package before this module, and the package, seeing it (``_COMMAND_LINE_FIRST``), left torch and
the backend out: its ``__init__`` runs again here, in the same module, for a command that uses the device.
"""

import neuron_lab
from neuron_lab.cli import main_parsing_first


def _install() -> None:
    if neuron_lab._COMMAND_LINE_FIRST:
        neuron_lab.__spec__.loader.exec_module(neuron_lab)


raise SystemExit(main_parsing_first(_install))
