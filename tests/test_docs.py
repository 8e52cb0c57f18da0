"""The README's generated reference blocks match the code, and the generator itself works."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_lab.compat import argparse as argparse_compat
from neuron_lab.magics.parser import build, commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCRIPT = ROOT / "tools" / "readme_reference.py"  # a tool of the checkout, not part of the installed package
_spec = importlib.util.spec_from_file_location("readme_reference", SCRIPT)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def test_readme_reference_blocks_are_what_the_code_generates():
    text = README.read_text(encoding="utf-8")
    assert reference.render(text) == text, "run `make readme` and commit README.md"


def test_every_magic_and_every_flag_is_in_the_readme():
    text = README.read_text(encoding="utf-8")
    p = build()
    for name, sp, _ in commands(p):
        assert f"**`{reference._usage(sp)}`**" in text, name
        for a in argparse_compat.arguments(sp):
            for flag in a.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, f"{name} {flag}"


def test_a_stale_block_is_rewritten_and_check_fails_on_it(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n" + "".join(f"<!-- reference:{n} -->\nold\n<!-- /reference:{n} -->\n"
                                         for n in reference.BLOCKS) + "outro\n")
    cmd = [sys.executable, str(SCRIPT), str(doc)]
    check = subprocess.run([*cmd, "--check"], capture_output=True, text=True)
    assert check.returncode == 1 and "reference blocks are stale" in check.stderr
    assert subprocess.run([*cmd, "--write"]).returncode == 0
    new = doc.read_text()
    assert new.startswith("intro\n") and new.endswith("outro\n") and "\nold\n" not in new
    assert "`%%neuron parity [--against cpu|DEVICE]" in new and "| `auto_report` | `True` |" in new
    assert subprocess.run([*cmd, "--check"]).returncode == 0


def test_a_file_without_markers_is_a_clear_error(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("no blocks here\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(doc), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no <!-- reference:magics --> ... <!-- /reference:magics --> block" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["make demo", "make test", "make lab", "make wheel", "make wheel-check"])
def test_the_readme_names_the_make_targets(command):
    assert f"{command}" in README.read_text(encoding="utf-8")
