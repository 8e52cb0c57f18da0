"""Argument conditions: a registered op that TorchNeuron still runs on the CPU for some arguments, per call.

TorchNeuron tries an op's implementations by priority and falls back to the CPU when no ``can_handle`` takes the
call (``python_ops/base.py``, ``Operation.__call__``). What none takes, read from the source, is a list of tests on
the call's arguments, named as the op's schema names them (``dim``, ``largest``, ``self``). Both cores evaluate them
on every call of an op that has them (the compiled core in ``csrc/aten/dispatch.cpp``, the same tests), and a call
meeting one gets its rule's kind; an op without them pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_lab.backend.coverage import names

# test -> what it means, for messages and docs. The compiled core knows the same names (csrc/aten/dispatch.cpp).
TESTS: dict[str, str] = {
    "ndim_not_in": "the tensor's number of dimensions is none of `value`",
    "not_last_dim": "the dimension is not the last of the tensor `of`",
    "below": "the number is below `value`",
    "is": "the argument is `value` (true or false)",
    "empty": "the tensor has no elements",
}


# An argument rule's fields and what each holds (kind, test and arg required): the one home of the docs' table.
FIELDS: dict[str, str] = {
    "kind": "what a call that meets the test is reported as, one of a rule's kinds",
    "test": "one of the tests below",
    "arg": "the argument tested, as the op's schema names it (`self`, `dim`): an argument of any of its overloads",
    "value": "what `ndim_not_in` (a list of ints), `below` (an int) and `is` (true or false) compare with",
    "of": "for `not_last_dim`: the tensor argument whose last dimension `arg` must be",
    "reason": "the sentence reports show for a call that meets it",
    "evidence": "the class of its evidence, as for a rule",
}


@dataclass(frozen=True)
class ArgRule:
    """One test on one argument; a call that meets it takes ``kind`` (``shown``: the reason as reports show it)."""

    kind: str
    test: str
    arg: str
    shown: str
    value: Any = None
    of: str | None = None
    reason: str = ""
    evidence: str | None = None


def met(rule: ArgRule, value_of: Callable[[str], Any]) -> bool:
    """Whether a call meets ``rule``; ``value_of(name)`` is the call's argument of that name (its default if omitted).
    An argument that is not what the test reads (a list, None) never meets it."""
    v = value_of(rule.arg)
    if rule.test == "ndim_not_in":
        return hasattr(v, "dim") and v.dim() not in rule.value
    if rule.test == "empty":
        return hasattr(v, "numel") and v.numel() == 0
    if rule.test == "is":
        return isinstance(v, bool) and v is rule.value
    if isinstance(v, bool) or not isinstance(v, int):
        return False
    if rule.test == "below":
        return v < rule.value
    of = value_of(rule.of) if rule.of else None
    if not hasattr(of, "dim"):
        return False
    ndim = max(of.dim(), 1)  # a 0-d tensor's only dimension is 0 (or -1), as PyTorch wraps it
    return (v + ndim if v < 0 else v) != ndim - 1


def problems(field: str, value: Any, kinds: tuple[str, ...], evidence: tuple[str, ...],
             arguments: tuple[str, ...] | None = None) -> list[str]:
    """Every part of ``value`` (an op rule's ``args``) that is not an argument rule, one line each. ``arguments``: the
    op's argument names, which a rule's ``arg`` and ``of`` must be (None: not checked), since a misspelt one is never
    met."""
    if not isinstance(value, list):
        return [f"{field}: expected a list of argument rules, got {type(value).__name__}"]
    allowed = tuple(FIELDS)
    out: list[str] = []
    for i, r in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(r, dict):
            out.append(f"{at}: expected an object {{\"kind\", \"test\", \"arg\", ...}}")
            continue
        out += [f"{at}: unknown field {k!r} (an argument rule has {', '.join(allowed)})" for k in r if k not in allowed]
        if r.get("kind") not in kinds:
            out.append(f"{at}.kind: expected one of {', '.join(kinds)}")
        if r.get("test") not in tuple(TESTS):  # a tuple: a list or object is unhashable
            out.append(f"{at}.test: expected one of {', '.join(TESTS)}")
        if not isinstance(r.get("arg"), str):
            out.append(f"{at}.arg: expected the argument's name in the op's schema, such as \"dim\"")
        if "evidence" in r and r["evidence"] not in evidence:
            out.append(f"{at}.evidence: expected one of {', '.join(evidence)}")
        if r.get("test") in tuple(TESTS):
            out += _value_problems(at, r)
        if arguments is not None:
            out += _name_problems(at, r, arguments)
    return out


def _value_problems(at: str, r: dict) -> list[str]:
    test, v = r["test"], r.get("value")
    ok = {"ndim_not_in": isinstance(v, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in v),
          "below": isinstance(v, int) and not isinstance(v, bool), "is": isinstance(v, bool),
          "not_last_dim": isinstance(r.get("of"), str), "empty": True}[test]
    if ok:
        return []
    need = {"ndim_not_in": "value: a list of ints", "below": "value: an int", "is": "value: true or false",
            "not_last_dim": "of: the tensor argument's name"}[test]
    return [f"{at}: the test {test!r} needs {need}"]


def _name_problems(at: str, r: dict, arguments: tuple[str, ...]) -> list[str]:
    """``arg`` and ``of`` each an argument of the op (any overload), else the rule is never met."""
    return [f"{at}.{k}: expected an argument of the op ({', '.join(arguments)}), got {r[k]!r}"
            f"{names.did_you_mean(r[k], arguments)}"
            for k in ("arg", "of") if isinstance(r.get(k), str) and r[k] not in arguments]
