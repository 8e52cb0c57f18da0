"""ipyparallel's own Slurm engine launcher, with the ``#SBATCH`` options it has no trait for.

``SlurmEngineSetLauncher`` writes ``--partition``, ``--account``, ``--qos`` and ``--time`` from its traits (``queue``,
``account``, ``qos``, ``timelimit``) into its batch script, but not its ``options`` trait: this launcher adds each of
those (``--nodes=2 --ntasks-per-node=2``) as an ``#SBATCH`` line of its own. Everything else (``sbatch``, ``srun``,
``scancel`` at stop) is ipyparallel's.
"""

from __future__ import annotations

import os
import shlex

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher


class SlurmEngines(SlurmEngineSetLauncher):
    """``SlurmEngineSetLauncher`` whose ``options`` reach the batch script, written into the cluster's profile
    folder (the launcher writes it into the current folder: the notebook's)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.batch_file = os.path.join(self.profile_dir, self.batch_file_name)

    def _insert_options_in_script(self) -> None:
        super()._insert_options_in_script()
        lines = [f"#SBATCH {shlex.quote(o)}".replace("{", "{{").replace("}", "}}") for o in shlex.split(self.options)]
        if lines:
            first, rest = self.batch_template.split("\n", 1)
            self.batch_template = "\n".join([first, *lines, rest])
