"""MkDocs hooks (``mkdocs.yml``'s ``hooks:``): the site is laid out from the repository as it stands.

The README is the home page, ``docs/*.md`` the pages beside it and ``notebooks/*.ipynb`` the executed copies
``make docs`` wrote. Links are written for GitHub (``docs/x.md`` from the README, ``../README.md`` from a page),
so each is rewritten to where its file sits in the site; one that names a file the site lacks is left alone
for MkDocs' link validation to report (``mkdocs build --strict`` fails on it).
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority, get_plugin_logger
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "out" / "docs" / "notebooks"  # where `make docs` has `neuron-lab run` write them
STATIC = ROOT / "out" / "docs" / "static"  # the copies the site renders (below)
HOME = "index.md"

log = get_plugin_logger(__name__)
# A code span or block (kept as it is; a span may wrap onto the next line, as CommonMark allows, not past a blank
# line), or a Markdown link's or image's target.
LINK = re.compile(r"(```.*?```|`(?:[^`\n]|\n(?!\n))*`)|(\]\()([^)\s]+)(\))", re.S)


def site_path(repo_path: str) -> str | None:
    """Where the repository file ``repo_path`` sits in the site, or None when the site has no copy of it."""
    if repo_path == "README.md":
        return HOME
    top, _, rest = repo_path.partition("/")
    if top == "docs" and rest:
        return rest
    return repo_path if top == "notebooks" and rest else None


def repo_path(src_uri: str) -> str:
    """The inverse of :func:`site_path` for a page of the site."""
    if src_uri == HOME:
        return "README.md"
    return src_uri if src_uri.startswith("notebooks/") else f"docs/{src_uri}"


def relink(markdown: str, page_uri: str) -> str:
    """``markdown`` of the page at ``page_uri`` with each relative link moved from the repository's layout to
    the site's."""
    here = posixpath.dirname(repo_path(page_uri))

    def move(m: re.Match) -> str:
        target = m.group(3)
        if m.group(1) or re.match(r"[a-z][a-z0-9+.-]*:|#|/", target or ""):
            return m.group(0)
        path, hashmark, frag = target.partition("#")
        moved = site_path(posixpath.normpath(posixpath.join(here, path)))
        if moved is None:
            return m.group(0)
        rel = posixpath.relpath(moved, posixpath.dirname(page_uri) or ".")
        return f"{m.group(2)}{rel}{hashmark}{frag}{m.group(4)}"

    return LINK.sub(move, markdown)


def static_copy(executed: Path) -> None:
    """The notebook without its widgets' saved state, so each widget shows its static snapshot (as
    ``neuron-lab run --html`` does) and the page loads no widget library from the web."""
    nb = json.loads(executed.read_text(encoding="utf-8"))
    nb.get("metadata", {}).pop("widgets", None)
    out = STATIC / "notebooks" / executed.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns the notebooks added here into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, HOME, abs_src_path=str(ROOT / "README.md")))
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        executed = EXECUTED / source.name
        if not executed.is_file():
            log.warning("%s has not been executed (no %s): `make docs` runs it first; shown without outputs",
                        source.relative_to(ROOT), executed.relative_to(ROOT))
            executed = source
        static_copy(executed)  # a file of its own under STATIC: mkdocs-jupyter reads it from src_dir
        files.append(File(f"notebooks/{source.name}", src_dir=str(STATIC), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return relink(markdown, page.file.src_uri)
