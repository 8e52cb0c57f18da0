"""The docs' reference blocks, generated from the code they describe so the two cannot drift.

Every magic and flag comes from the ``%neuron`` parser (the same one that parses and prints
``%neuron?``), every ``%config`` setting and environment variable from the settings registry
(``neuron_lab/settings.py``, which ``neuron-lab doctor`` lists too). ``python tools/readme_reference.py
--write`` rewrites the blocks between ``<!-- reference:NAME -->`` and ``<!-- /reference:NAME -->`` in the pages that
hold them (``docs/notebook.md``: the magics; ``docs/configuration.md``: the settings and the environment;
``docs/torchneuron.md``: TorchNeuron's shape and empty-tensor gates, from the bundled evidence, and a coverage file's
format, from its schema; ``docs/headless.md``:
``neuron-lab run``'s exit codes, from its ``--help``; other files can be named
instead, and together they must hold every block once); ``--check`` fails when they are stale
(the test suite runs the same comparison). A tool of this checkout, not
part of the installed package: it documents the code beside it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's neuron_lab, the one the docs describe

from neuron_lab import settings as registry  # noqa: E402
from neuron_lab.compat import argparse as argparse_compat  # noqa: E402

PIPE = " \\| "  # a | inside a Markdown table cell or list item


def _usage(sp: argparse.ArgumentParser) -> str:
    text = " ".join(sp.format_usage().split())
    return text.removeprefix("usage: ").replace(" [-h]", "")


def _flag(a: argparse.Action) -> str:
    if not a.option_strings:
        return a.metavar or a.dest
    name = a.option_strings[-1]
    if a.nargs == 0:
        return name
    metavar = a.metavar or a.dest.upper()
    return f"{name} {metavar} ..." if a.nargs in ("+", "*") else f"{name} {metavar}"


def _sentence(text: str) -> str:
    text = text.strip()
    return text + ("" if text.endswith(".") else ".")


def magics() -> str:
    """Every ``%neuron`` / ``%%neuron`` command with its usage, what it does, and each argument."""
    from neuron_lab.magics.parser import CELL_ONLY, LINE_ONLY, build, commands

    p = build()
    lines = [f"`{_usage(p)}`: {p.description}", ""]
    for name, sp, short in commands(p):
        kind = "cell magic" if name in CELL_ONLY else "line magic" if name in LINE_ONLY else "line or cell magic"
        what = _sentence(sp.description or short.removeprefix("cell magic: "))
        lines.append(f"- **`{_usage(sp)}`** ({kind}): {what}")
        for a in argparse_compat.arguments(sp):
            if not a.help or a.help == argparse.SUPPRESS:
                continue
            choices = f" ({PIPE.join(a.choices)})" if a.choices and not a.option_strings else ""
            default = ""
            if a.option_strings and a.default not in (None, False, [], argparse.SUPPRESS) \
                    and "default" not in a.help:
                default = f" Default: `{a.default}`."
            lines.append(f"  - `{_flag(a)}`{choices}: {_sentence(a.help)}{default}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", PIPE.strip())


def settings() -> str:
    """The ``%config NeuronLab.*`` settings: name, default, meaning."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for name, s in sorted(registry.CONFIG.items()):
        kind = f" One of {', '.join(f'`{v!r}`' for v in s.choices)}." if s.choices else ""
        rows.append(f"| `{name}` | `{s.default!r}` | {_cell(s.help)}{kind} |")
    return "\n".join(rows)


def environment() -> str:
    """The environment variables ``neuron-lab doctor`` lists."""
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{v.name}` | {_cell(_sentence(v.summary))} |" for v in registry.listed()]
    return "\n".join(rows)


def gates() -> str:
    """TorchNeuron's shape and empty-tensor ``can_handle`` gates (``tools/derive_profile.py``'s evidence): each with
    the op it guards, what it turns away, where a call no implementation takes goes, and whether a rule uses it."""
    import json
    from importlib import resources

    data = json.loads(resources.files("neuron_lab.backend.coverage").joinpath(
        "evidence/torchneuron-src-2026-04.json").read_text(encoding="utf-8"))
    rows = ["| gate (`python_ops/`file:line) | op | what it turns away | residue | used |", "|---|---|---|---|---|"]
    for g in data["gates"]:
        if not g["conditions"]:
            continue
        path = g["path"].removeprefix("torch_neuronx/python_ops/").removeprefix("torch_neuronx/")
        ops = sorted({o.removeprefix("aten::").split(".")[0] for o in g["ops"] or []})
        left = ", ".join(sorted(set((g["residue"] or {}).values()))) or "-"
        rows.append(f"| `{g['class']}` `{path}:{g['line']}` | {', '.join(f'`{o}`' for o in ops) or '-'} | "
                    f"{_cell(g.get('reading', '-'))} | {left} | {_cell(g['used'])} |")
    return "\n".join(rows)


def coverage_format() -> str:
    """A coverage file's fields, its rules', its argument rules', the argument tests and the evidence classes, from
    the schema that checks a file (``neuron_lab/backend/coverage/schema.py``, ``conditions.py``)."""
    from neuron_lab.backend.coverage import OP_KINDS, conditions, schema
    from neuron_lab.kinds import KINDS

    kinds = ", ".join(f"`{k}` ({KINDS[k].title})" for k in OP_KINDS)
    out = ["| field | required | holds |", "|---|---|---|"]
    out += [f"| `{k}` | {'yes' if k in schema.REQUIRED else 'no'} | {_cell(_sentence(v))} |"
            for k, v in schema.FIELDS.items()]
    out += ["", "A rule (of `default`, of a dtype, of an op):", "", "| field | in | holds |", "|---|---|---|"]
    for i, (k, v) in enumerate(schema.RULE_FIELDS.items()):
        where = "every rule" if i < schema.COMMON_RULE_FIELDS else "an op's rule"
        holds = f"{v}: one of {kinds}" if k == "kind" else v
        out.append(f"| `{k}`{' (required)' if k == 'kind' else ''} | {where} | {_cell(_sentence(holds))} |")
    out += ["", "An argument rule (`args`; `kind`, `test` and `arg` required):", "", "| field | holds |", "|---|---|"]
    out += [f"| `{k}` | {_cell(_sentence(v))} |" for k, v in conditions.FIELDS.items()]
    out += ["", "| test | a call meets it when |", "|---|---|"]
    out += [f"| `{k}` | {_cell(_sentence(v))} |" for k, v in conditions.TESTS.items()]
    out += ["", "| evidence | confidence | meaning |", "|---|---|---|"]
    out += [f"| `{k}` | {level} | {_cell(_sentence(means))} |" for k, (level, means) in schema.EVIDENCE.items()]
    return "\n".join(out)


def exit_codes() -> str:
    """``neuron-lab run``'s exit codes and what each means, as its ``--help`` and its last line say them."""
    from neuron_lab.runner.options import MEANINGS

    rows = ["| code | meaning |", "| --- | --- |"]
    flags = re.compile(r"--[a-z][a-z-]*")
    rows += [f"| {code} | {_cell(flags.sub(lambda m: f'`{m.group()}`', meaning))} |"
             for code, meaning in MEANINGS.items()]
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {"magics": magics, "settings": settings, "environment": environment,
                                        "gates": gates, "coverage_format": coverage_format, "exit_codes": exit_codes}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- reference:{name} -->\n)(.*?)(<!-- /reference:{name} -->)", re.S)


ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "docs" / "notebook.md", ROOT / "docs" / "configuration.md", ROOT / "docs" / "torchneuron.md",
         ROOT / "docs" / "headless.md")


def present(text: str) -> list[str]:
    """The names of the reference blocks ``text`` holds."""
    return [name for name in BLOCKS if _pattern(name).search(text)]


def render(text: str, names: list[str] | None = None) -> str:
    """``text`` with its reference blocks ``names`` (default: every block) regenerated; a missing marker pair is
    an error."""
    for name in BLOCKS if names is None else names:
        make = BLOCKS[name]
        pat = _pattern(name)
        if not pat.search(text):
            raise ValueError(f"no <!-- reference:{name} --> ... <!-- /reference:{name} --> block")
        text = pat.sub(lambda m, body=make(): m.group(1) + body + "\n" + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/readme_reference.py", description=__doc__.splitlines()[0])
    ap.add_argument("files", type=Path, nargs="*", default=list(PAGES),
                    help="the Markdown files that together hold every reference block once "
                         "(default: docs/notebook.md docs/configuration.md docs/torchneuron.md docs/headless.md)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the blocks in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    args = ap.parse_args(argv)
    olds = {f: f.read_text(encoding="utf-8") for f in args.files}
    held = {f: present(text) for f, text in olds.items()}
    where = " ".join(str(f) for f in args.files)
    for name in BLOCKS:
        count = sum(name in names for names in held.values())
        if count != 1:
            what = "no" if count == 0 else f"{count} files with a"
            print(f"{where}: {what} <!-- reference:{name} --> ... <!-- /reference:{name} --> block", file=sys.stderr)
            return 2
    news = {f: render(text, held[f]) for f, text in olds.items()}
    if args.write:
        for f, new in news.items():
            if new != olds[f]:
                f.write_text(new, encoding="utf-8")
        return 0
    stale = [str(f) for f in args.files if news[f] != olds[f]]
    if stale:
        print(f"{' '.join(stale)}: reference blocks are stale; run `python tools/readme_reference.py --write {where}`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
