"""The ``neuron-lab`` console script: it reads its command line before ``import neuron_lab`` runs.

``import neuron_lab`` imports torch and installs the backend (some 2 s), which ``--help``, ``--version`` and a mistyped
argument do not need. So this makes the package's module without running its ``__init__``, imports
``neuron_lab.cli`` into it (the parser imports nothing heavy) and parses; only then does the package's ``__init__``
run in that same module, after which the process is what ``import neuron_lab`` makes and the command runs. ``run``
skips it: its cells run in kernels (which import torch themselves), so its own process never loads torch, some 2 s
less before the first kernel starts. ``python -m neuron_lab`` takes the same path (``neuron_lab/__main__.py``).
"""

from __future__ import annotations

import importlib.util
import sys


def main() -> int:
    spec = importlib.util.find_spec("neuron_lab")
    assert spec is not None and spec.loader is not None, "neuron_lab is not installed"
    package = importlib.util.module_from_spec(spec)
    sys.modules["neuron_lab"] = package
    from neuron_lab import cli

    return cli.main_parsing_first(lambda: spec.loader.exec_module(package))  # `import neuron_lab`: torch, the backend


if __name__ == "__main__":
    raise SystemExit(main())
