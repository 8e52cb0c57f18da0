"""Op names in a coverage file: the key a rule is filed under, and whether this process's PyTorch knows the op and
its arguments.

The emulator matches a call to its rule by the op's name alone (``aten::topk``, any overload) and reads an argument
condition's argument by its schema name, so a misspelt op or argument is a rule that never applies: a file of one's
own is checked against the dispatcher's registry (every registered op) and the ops' schemas (every overload's
argument names), the same names the emulator reads from a call.
"""

from __future__ import annotations

import difflib


def key(name: str) -> str:
    """``aten::add_`` and ``aten::add`` share one entry: in-place variants run where their op runs."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def registered() -> frozenset[str]:
    """The name of every op this process's PyTorch has registered, without its overload (``aten::add``)."""
    import torch

    return frozenset(n.split(".")[0] for n in torch._C._dispatch_get_all_op_names())


def known(name: str, ops: frozenset[str]) -> bool:
    """Whether a rule filed under ``name`` can apply to an op of ``ops`` (the op or its in-place form)."""
    k = key(name)
    return k in ops or f"{k}_" in ops


def arguments(name: str) -> tuple[str, ...]:
    """The argument names of every overload of the op filed under ``name`` and of its in-place form, in schema order
    (none for an op PyTorch does not know)."""
    import torch

    k = key(name)
    schemas = [s for n in (k, f"{k}_") for s in torch._C._jit_get_schemas_for_operator(n)]
    return tuple(dict.fromkeys(a.name for s in schemas for a in s.arguments))


def did_you_mean(name: str, candidates: frozenset[str] | tuple[str, ...], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the one of ``candidates`` a misspelt ``name`` most likely meant, or nothing when
    none is close (``cutoff``, 0-1: op names want more, as their shared ``aten::`` makes any two alike)."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""
