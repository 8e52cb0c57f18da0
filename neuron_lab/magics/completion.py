"""Tab completion after ``%neuron`` and ``%%neuron``: commands, their options and option values.

An IPython matcher (API v2, ``shell.Completer.custom_matchers``) that reads everything from the magic's
own parser: the commands each form accepts, each command's options, ``choices`` and the ``completer``
an argument names (variables of the namespace, bundled coverages, kept reports, paths). Inside a ``%neuron``
line it suppresses IPython's other matchers, which would offer ``%debug`` or builtins there.
"""

from __future__ import annotations

import argparse
import math
import re

from IPython.core.completer import CompletionContext, SimpleCompletion, SimpleMatcherResult, context_matcher

from neuron_lab.magics import parser as _parser
from neuron_lab.session.session import Session

IDENTIFIER = "neuron_lab.magics"  # the matcher's id (IPython's `IPCompleter.disable_matchers` can name it)
# The magic's words up to the cursor: `%neuron ...` anywhere a line magic may stand (`x = %neuron ...` too),
# `%%neuron ...` on a cell's first line only.
_LINE = re.compile(r"\s*(?:[A-Za-z_]\w*\s*=\s*)?%neuron\s+(?P<words>.*)")
_CELL = re.compile(r"\s*%%neuron\s+(?P<words>.*)")


class NeuronCompleter:
    """Completes the words of ``%neuron``/``%%neuron`` lines in one shell, from the magic's parser."""

    def __init__(self, parser: _parser.NeuronArgumentParser, session: Session) -> None:
        self.parser = parser
        self.session = session

    @context_matcher(identifier=IDENTIFIER)
    def matcher(self, context: CompletionContext) -> SimpleMatcherResult:
        found = _CELL.fullmatch(context.text_until_cursor) if context.cursor_line == 0 else None
        cell = found is not None
        found = found or _LINE.fullmatch(context.text_until_cursor)
        if found is None:
            return SimpleMatcherResult(completions=[], suppress=False)
        text = found["words"]
        done = text.split()
        word = "" if not text or text[-1].isspace() else done.pop()
        words = [w for w in self.candidates(done, word, cell=cell) if w.startswith(word)]
        return SimpleMatcherResult(completions=[SimpleCompletion(w, type="param") for w in words],
                                   matched_fragment=word, suppress=True, ordered=True)

    def candidates(self, done: list[str], word: str, *, cell: bool) -> list[str]:
        """What may follow the words ``done`` of a ``%neuron`` (``cell``: ``%%neuron``) line, ``word`` being typed."""
        if not done:
            return [] if word.startswith("-") else _parser.commands_for(self.parser, cell=cell)
        if done[0] not in self.parser.subcommands:
            return []
        sp = self.parser.subcommands[done[0]][0]
        if word.startswith("-"):
            given = set(done)
            return [s for a in _parser.options(sp) if given.isdisjoint(a.option_strings)
                    for s in a.option_strings if s.startswith("--")]
        action = _taking(sp, done[1:])
        if action is None:
            return []
        if action.choices is not None:
            return [str(c) for c in action.choices]
        complete = getattr(action, "completer", None)
        return list(complete(self.session, word)) if complete is not None else []


def _taking(sp: argparse.ArgumentParser, words: list[str]) -> argparse.Action | None:
    """The argument the next word of a command goes to, after its ``words``: an option still taking values,
    else the next positional; None when neither takes one."""
    flags = {s: a for a in sp._actions for s in a.option_strings}
    positional = iter(_parser.positionals(sp))
    current, room = next(positional, None), 0  # the positional being filled, and the option values still allowed
    option = None
    for w in words:
        if w.startswith("-"):
            option = flags.get(w) or _abbreviated(flags, w)
            room = 0 if option is None or option.nargs == 0 else math.inf if option.nargs in ("+", "*") else 1
        elif room:
            room -= 1
        elif current is not None and current.nargs not in ("+", "*"):
            current = next(positional, None)
    return option if room else current


def _abbreviated(flags: dict[str, argparse.Action], word: str) -> argparse.Action | None:
    """The option a unique prefix stands for, as argparse's ``allow_abbrev`` reads it."""
    matches = {a for s, a in flags.items() if s.startswith(word)}
    return matches.pop() if len(matches) == 1 else None
