"""Preflight, before ``init_process_group``: the facts every rank must share, compared across ranks.

Ranks whose torch, torch-neuronx or neuron_lab differ, or whose Neuron runtime and EFA settings (``TORCH_NEURONX_*``,
``NEURON_RT_*``, ``FI_PROVIDER``, ``FI_EFA_*``) differ, hang or fail far from the cause once the group runs. So each
rank puts its facts in the rendezvous store (the one ``MASTER_ADDR``/``MASTER_PORT`` name), reads every rank's, and
when they disagree raises :class:`PreflightMismatch` on every rank with one table of them, before the group exists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from neuron_lab._version import __version__
from neuron_lab.report.rows import Table
from neuron_lab.report.text import columns
from neuron_lab.session import launch, placement

AGREE_PREFIXES = ("TORCH_NEURONX_", "NEURON_RT_", "FI_EFA_")
AGREE_NAMES = ("FI_PROVIDER",)
PER_RANK = ("NEURON_RT_VISIBLE_CORES",)  # a rank's own core: meant to differ
VERSIONS = ("torch", "torch-neuronx", "neuron_lab")
SHOWN = (placement.ROOT_COMM_ENV,)  # settings every table shows: where the group's collectives bootstrap
TIMEOUT_S = 300.0  # how long a rank waits at the preflight for the others (the launcher's, when it gives none)
_KEY = "neuron_lab/preflight/{}"


class PreflightMismatch(RuntimeError):
    """The ranks' versions or settings differ; the message is the table that shows where."""


def must_agree(name: str) -> bool:
    return name not in PER_RANK and (name in AGREE_NAMES or name.startswith(AGREE_PREFIXES))


def _torch_neuronx() -> str:
    """The installed torch-neuronx's version, or the bundled emulator's stand-in's."""
    try:
        return metadata.version("torch-neuronx")
    except metadata.PackageNotFoundError:
        from neuron_lab.backend.emulator.neuronx import __version__ as emulated

        return emulated


def facts(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This rank's facts: its host and core, the versions, and the settings that must agree."""
    env = os.environ if env is None else env
    return {"rank": int(env.get("RANK", "0")), "host": placement.host_name(env),
            "cores": env.get("NEURON_RT_VISIBLE_CORES", ""),
            "versions": {"torch": metadata.version("torch"), "torch-neuronx": _torch_neuronx(),
                         "neuron_lab": __version__},
            "settings": {k: v for k, v in sorted(env.items()) if must_agree(k)}}


def mismatches(ranks: list[dict[str, Any]]) -> list[str]:
    """The versions and settings that are not the same on every rank (a setting unset somewhere counts)."""
    out = [v for v in VERSIONS if len({r["versions"][v] for r in ranks}) > 1]
    names = sorted({k for r in ranks for k in r["settings"]})
    return out + [k for k in names if len({r["settings"].get(k) for r in ranks}) > 1]


def table(ranks: list[dict[str, Any]]) -> str:
    """One row per rank: host, cores, versions, where the group bootstraps (``NEURON_RT_ROOT_COMM_ID``) and each
    setting that differs (``-``: unset), under a line that says what differs."""
    differ = mismatches(ranks)
    settings = [*SHOWN, *(k for k in differ if k not in VERSIONS and k not in SHOWN)]
    rows = [[str(r["rank"]), r["host"], r["cores"] or "-", *(r["versions"][v] for v in VERSIONS),
             *(r["settings"].get(k, "-") for k in settings)] for r in sorted(ranks, key=lambda r: r["rank"])]
    head = (f"neuron_lab preflight: {len(ranks)} ranks differ in {', '.join(differ)}" if differ else
            f"neuron_lab preflight: {len(ranks)} ranks agree")
    return "\n".join([head, *columns(Table(["rank", "host", "cores", *VERSIONS, *settings], rows))])


def check(timeout_s: float, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Put this rank's facts in the rendezvous store, read every rank's, and raise :class:`PreflightMismatch` (on
    every rank alike) when they differ; every rank's facts otherwise."""
    env = os.environ if env is None else env
    mine = facts(env)
    size = int(env.get("WORLD_SIZE", "1"))
    store = launch.store_client(env, timeout_s)
    store.set(_KEY.format(mine["rank"]), json.dumps(mine))
    keys = [_KEY.format(r) for r in range(size)]
    store.wait(keys)  # the store's timeout bounds it: a rank that never came is its TimeoutError
    ranks = [json.loads(v) for v in store.multi_get(keys)]
    if mismatches(ranks):
        raise PreflightMismatch(table(ranks))
    return ranks
