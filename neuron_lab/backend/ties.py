"""Weight ties that a device move split apart.

PyTorch moves a module to a PrivateUse1 device by creating new Parameters (its shallow-copy
check knows only the built-in dense backends), which silently unties shared weights such as
Hugging Face's input/output embeddings. Snapshot before a move, check after: this works on
any backend, so the workbench can warn on the real TorchNeuron too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TieGroup:
    names: tuple[str, ...]  # parameter names that shared one Parameter before the move


def tied_groups(module: torch.nn.Module) -> list[TieGroup]:
    """Parameter names grouped by the Parameter object they share (groups of two or more)."""
    by_id: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [TieGroup(tuple(names)) for names in by_id.values() if len(names) > 1]


def untied_after_move(module: torch.nn.Module, before: list[TieGroup]) -> list[TieGroup]:
    """The groups of ``before`` whose names no longer refer to one Parameter."""
    params = dict(module.named_parameters(remove_duplicate=False))
    broken = []
    for group in before:
        ids = {id(params[n]) for n in group.names if n in params}
        if len(ids) > 1:
            broken.append(group)
    return broken
