"""The docs' generated reference blocks match the code, the generator itself works, and every link between the
README and the pages under ``docs/`` resolves."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from neuron_lab.compat import argparse as argparse_compat
from neuron_lab.magics.parser import build, commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAGICS = DOCS / "notebook.md"  # the page with the magics' reference block
PAGES = (README, *sorted(DOCS.glob("*.md")))
SITE = ROOT / "mkdocs.yml"  # the documentation site `make docs` builds
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCRIPT = ROOT / "tools" / "readme_reference.py"  # a tool of the checkout, not part of the installed package
_spec = importlib.util.spec_from_file_location("readme_reference", SCRIPT)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
_spec = importlib.util.spec_from_file_location("docs_site", ROOT / "tools" / "docs_site.py")  # mkdocs.yml's hooks
site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site)


def test_the_reference_blocks_are_what_the_code_generates():
    held = []
    for page in reference.PAGES:
        text = page.read_text(encoding="utf-8")
        names = reference.present(text)
        assert reference.render(text, names) == text, f"run `make readme` and commit {page.relative_to(ROOT)}"
        held += names
    assert sorted(held) == sorted(reference.BLOCKS)  # every block, once


def test_every_magic_and_every_flag_is_in_the_docs():
    text = MAGICS.read_text(encoding="utf-8")
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


@pytest.mark.parametrize("command", ["make demo", "make test", "make lab", "make wheel", "make wheel-check",
                                     "make docs"])
def test_the_readme_names_the_make_targets(command):
    assert f"{command}" in README.read_text(encoding="utf-8")


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); inline code is dropped before matching
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE.sub(lambda m: m.group(0) if m.group(0).startswith("`") and not m.group(0).startswith("```") else "",
                    page.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(pages) -> list[str]:
    """Every relative link of ``pages`` that names no file, or no heading of the file it names."""
    broken = []
    for page in pages:
        text = CODE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_file():
                broken.append(f"{page.name}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading in {dest.name})")
    return broken


def test_every_relative_link_in_the_docs_resolves():
    assert broken_links(PAGES) == []


def test_every_docs_page_is_linked_from_the_readme():
    links = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text(encoding="utf-8"))}
    assert [p.name for p in DOCS.glob("*.md") if p.resolve() not in links] == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page: `x`, y!\n\n[ok](b.md#the-b-page) [self](#a-page-x-y) "
                                   "[img](pic.png) `[not a link](nowhere.md)`\n")
    (tmp_path / "b.md").write_text("# The B page\n\n[gone](missing.md) [bad anchor](a.md#nothing) [web](https://x.org/y)\n")
    (tmp_path / "pic.png").write_bytes(b"")
    assert broken_links([tmp_path / "a.md", tmp_path / "b.md"]) == [
        "b.md: missing.md (no such file)", "b.md: a.md#nothing (no such heading in a.md)"]


class _SiteLoader(yaml.SafeLoader):
    """mkdocs.yml as data: its ``!!python/...`` values (the slugify function) read as None."""


_SiteLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_entries(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    items = nav.values() if isinstance(nav, dict) else nav
    return [e for item in items for e in nav_entries(item)]


def test_the_sites_nav_lists_the_home_every_docs_page_and_every_notebook():
    nav = nav_entries(yaml.load(SITE.read_text(encoding="utf-8"), Loader=_SiteLoader)["nav"])
    pages = ["index.md", *(p.name for p in DOCS.glob("*.md")), *(f"notebooks/{p.name}" for p in NOTEBOOKS)]
    assert sorted(nav) == sorted(pages)


def test_the_site_moves_a_github_link_to_where_its_file_sits_in_the_site():
    home = ("[a](docs/notebook.md#magics) ![b](docs/pic.png) [c](notebooks/01_quickstart.ipynb) `[d](docs/x.md)` "
            "[e](https://x.org/docs/y.md) [f](tools/x.py)")
    assert site.relink(home, "index.md") == (
        "[a](notebook.md#magics) ![b](pic.png) [c](notebooks/01_quickstart.ipynb) `[d](docs/x.md)` "
        "[e](https://x.org/docs/y.md) [f](tools/x.py)")
    wrapped = "checks it, `neuron-lab\ndoctor` included ([w](docs/development.md#wheels))"  # a span over a line end
    assert site.relink(wrapped, "index.md") == wrapped.replace("docs/development.md", "development.md")
    assert site.relink("[a](../README.md#set-up) [b](python.md) [c](../notebooks/03_memory.ipynb) [d](#here)",
                       "notebook.md") == "[a](index.md#set-up) [b](python.md) [c](notebooks/03_memory.ipynb) [d](#here)"
