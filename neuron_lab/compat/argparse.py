"""argparse's private names: the arguments a parser holds (the magics reference in docs/notebook.md lists each one).

neuron_lab supports Python 3.10 and later (``pyproject.toml``).
"""

from __future__ import annotations

import argparse


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument ``parser`` takes but ``-h``/``--help``, in the order they were added.

    argparse has no public way to list them: the private ``ArgumentParser._actions`` holds them and the private
    ``argparse._HelpAction`` class marks ``-h``, the same in every Python 3. Without ``_actions`` the list is
    empty (the reference shows a command's usage line alone); without ``_HelpAction``, ``-h`` is listed too.
    """
    help_action = getattr(argparse, "_HelpAction", ())
    return [a for a in getattr(parser, "_actions", []) if not isinstance(a, help_action)]
