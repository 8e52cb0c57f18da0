"""Real-browser test rig: a JupyterLab server on loopback, driven by Playwright with Debian's Chromium.

Why our own rig and not pytest-playwright's fixtures: no browser can be downloaded here, so Chromium is
Debian's (``/usr/bin/chromium``) with the flags that work on this machine, and every step needs an explicit
timeout (an unbounded wait once hung a run past ten minutes). The gotchas this encodes are listed in
``../shared/research/jupyter-anchors.md`` §5.

Use it from a test module with ``pytest_plugins = ["browser"]``, which brings the fixtures ``jupyter_lab``
(one server per session, so per pytest-xdist worker), ``chromium`` (one browser per session) and
``lab_page`` (a fresh page per test that saves a screenshot and logs to ``out/test-artifacts/`` when the
test fails). Open one notebook per page: the DOM helpers address the cells of the notebook in view.

A missing Chromium or Playwright skips these tests on a developer machine and fails them in CI.

PYTEST_DONT_REWRITE: this module has no asserts, and test modules import it before pytest_plugins registers it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat
import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# From the machine notes; they worked here (research note §5, gotcha 6).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MISSING_BROWSER = "real-browser tests need Debian's chromium: apt-get install -y chromium"

SERVER_START_TIMEOUT = 60.0  # seconds; the first start here took ~3.5 s
ACTION_TIMEOUT_MS = 30_000  # Playwright's default for every action and navigation on a lab_page
KERNEL_TIMEOUT = 60.0  # page load to kernel idle took 4-9 s here

# User settings written into the server's private settings dir: no news toast over the notebook, and every
# cell attached to the DOM so that `.jp-Cell` nth(i) is cell i however long the notebook is.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

# JS functions for page.evaluate / wait_for; compose them in a predicate as f"({JS_CELL_RUNNING})(0) && ...".
# They address the notebook in view (Lab's current widget).
_NOTEBOOK = "window.jupyterapp?.shell.currentWidget"
_CELLS = f"({_NOTEBOOK}?.content?.widgets ?? [])"
# Lab's own kernel status. It is NOT a busy signal: with ipykernel 7 and Lab 4.6 the control-channel requests
# Lab sends (create_subshell_request, debug_request) publish status "idle" while a cell is still running
# (ipykernel#799): the first widget cell here read "idle" for its whole 5 s loop.
JS_KERNEL_STATUS = f"() => {_NOTEBOOK}?.sessionContext?.session?.kernel?.status ?? null"
# The status the kernel last published for an execute_request: "busy" from a cell's start to its end.
# Recorded by the listener open_notebook installs.
JS_EXECUTION_STATE = "() => window.__rigExecutionState ?? null"
# Whether code cell i (0-based) is queued or running ("[*]"): true from run_all until its reply arrives.
JS_CELL_RUNNING = f"""(i) => {{ const c = {_CELLS}[i]; return !!c && c.model.type === 'code'
    && (c.model.executionState === 'running' || (c.promptNode?.textContent ?? '').includes('*')); }}"""
JS_RUNNING_CELLS = f"() => {_CELLS}.filter((c, i) => ({JS_CELL_RUNNING})(i)).length"
# The text of cell i's output area as rendered ("" before it has any).
JS_CELL_OUTPUT_TEXT = f"(i) => {_CELLS}[i]?.outputArea?.node?.textContent ?? ''"
_EXECUTION_COUNTS = f"() => {_CELLS}.map(c => c.model.executionCount ?? null)"
_TRACK_EXECUTION = f"""() => {{ const sc = {_NOTEBOOK}.sessionContext; window.__rigExecutionState = 'idle';
    sc.iopubMessage.connect((_, m) => {{
        if (m.header.msg_type === 'status' && m.parent_header?.msg_type === 'execute_request')
            window.__rigExecutionState = m.content.execution_state; }}); }}"""


def in_ci() -> bool:
    """CI sets ``CI=true``; there a missing browser is a broken setup, not a reason to skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_browser() -> None:
    """Skip (or, in CI, fail) unless Playwright and Debian's Chromium are both installed."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(CHROMIUM)
    if missing:
        message = f"{MISSING_BROWSER} (missing: {', '.join(missing)})"
        if in_ci():
            pytest.fail(f"CI never skips the browser tests: {message}", pytrace=False)
        pytest.skip(message)


@dataclass
class Lab:
    """A running JupyterLab server: where it listens, the directory it serves, and its log."""

    url: str  # "http://127.0.0.1:<port>/"
    root_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def notebook_url(self, name: str) -> str:
        # ?reset: start from an empty workspace, so no restored tab adds hidden cells to the DOM
        return f"{self.url}lab/tree/{name}?reset"


def _server_url(runtime_dir: Path) -> str | None:
    """The URL the server wrote into its info file: the port it listens on is known only there."""
    for info in runtime_dir.glob("jpserver-*.json"):
        try:
            url = json.loads(info.read_text())["url"]
        except (ValueError, KeyError, OSError):
            return None  # still being written
        return url if url.endswith("/") else url + "/"
    return None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}api/status", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM lets the server shut its kernels down; kill it if it has not gone in 20 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def lab_server(tmp_path_factory: pytest.TempPathFactory, timeout: float = SERVER_START_TIMEOUT) -> Iterator[Lab]:
    """Start ``python -m jupyterlab`` on 127.0.0.1 with no token, private dirs and a port the OS picks; always stop it.

    The config, data, runtime, IPython, settings and workspaces dirs are all temporary, so nothing on the
    developer's machine (old tabs, kernelspecs, startup files) leaks in, and two xdist workers never share
    one. The kernel is the venv's ``python3`` spec, which runs this interpreter.
    """
    base = tmp_path_factory.mktemp("jupyter_lab")
    dirs = {name: base / name for name in ("root", "config", "data", "runtime", "ipython", "settings", "workspaces")}
    for path in dirs.values():
        path.mkdir()
    for plugin, values in LAB_SETTINGS.items():
        settings = dirs["settings"] / f"{plugin}.jupyterlab-settings"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values))
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",  # the OS picks it; the server's info file says which
        "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={dirs['root']}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp, which the helpers below drive
        f"--LabApp.user_settings_dir={dirs['settings']}", f"--LabApp.workspaces_dir={dirs['workspaces']}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(dirs["config"]), "JUPYTER_DATA_DIR": str(dirs["data"]),
           "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]), "IPYTHONDIR": str(dirs["ipython"])}
    log_path = base / "lab.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=dirs["root"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        url = None
        while not (url and _answers(url)):
            if process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {process.returncode}; its log ends:\n"
                                   f"{Lab('', dirs['root'], log_path, process).log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab did not answer within {timeout:g} s; its log ends:\n"
                                   f"{Lab('', dirs['root'], log_path, process).log_tail()}")
            time.sleep(0.2)
            url = url or _server_url(dirs["runtime"])
        yield Lab(url, dirs["root"], log_path, process)
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One JupyterLab server per session (per xdist worker). Skips or fails first if there is no browser."""
    require_browser()
    with lab_server(tmp_path_factory) as lab:
        yield lab


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    """Debian's Chromium under Playwright's sync API, shared by the session's pages."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                                             timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item, so that ``lab_page`` knows at teardown whether the test failed."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@pytest.fixture
def lab_page(chromium: Browser, jupyter_lab: Lab, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh browser context and page; on failure, a screenshot and the console and server logs are saved."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.set_default_navigation_timeout(ACTION_TIMEOUT_MS)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda error: console.append(f"[pageerror] {error}"))
    try:
        yield page
    finally:
        reports = request.node.stash.get(_REPORTS, {})
        if any(r.failed for r in reports.values()):
            name = artifact_name(request.node.nodeid)
            screenshot(page, f"{name}-failure")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / f"{name}-failure.log").write_text(
                "== browser console ==\n" + "\n".join(console) + "\n\n== jupyter lab log ==\n"
                + jupyter_lab.log_tail(20_000))
        context.close()


def artifact_name(text: str) -> str:
    """A file-name-safe version of a test id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def screenshot(page: Page, name: str) -> Path | None:
    """Save a full-page PNG as ``out/test-artifacts/<name>.png``; None if the page can no longer be captured."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    try:
        page.screenshot(path=str(path), full_page=True, timeout=15_000)
    except Exception:  # a crashed or closed page must not hide the test's own failure
        return None
    return path


def write_notebook(root: Path, name: str, cells: Sequence[str]) -> Path:
    """Write code cells as ``root/name``, with the python3 kernelspec set so Lab starts it without asking."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = root / name
    nbformat.write(nb, path)
    return path


def wait_for(page: Page, predicate: str, timeout: float, polling: int = 100, arg: Any = None) -> Any:
    """Poll the JS function ``predicate`` (called with ``arg``) every ``polling`` ms until it returns a truthy
    value, and return that value; raise Playwright's TimeoutError after ``timeout`` seconds."""
    handle = page.wait_for_function(predicate, arg=arg, polling=polling, timeout=timeout * 1000)
    return handle.json_value()


def kernel_status(page: Page) -> str | None:
    """Lab's kernel status ("idle", "busy", "starting", ...), or None; see JS_KERNEL_STATUS for why it is
    no busy signal (use execution_state or cell_running for that)."""
    return page.evaluate(JS_KERNEL_STATUS)


def execution_state(page: Page) -> str | None:
    """The kernel's execution state: "busy" while it runs a cell, else "idle" (see JS_EXECUTION_STATE)."""
    return page.evaluate(JS_EXECUTION_STATE)


def cell_running(page: Page, index: int) -> bool:
    """Whether cell ``index`` (0-based) is queued or running."""
    return page.evaluate(JS_CELL_RUNNING, index)


def open_notebook(page: Page, lab: Lab, name: str, cells: Sequence[str], timeout: float = KERNEL_TIMEOUT) -> None:
    """Write the notebook into the server's root, open it in ``page`` and wait until its kernel is idle.

    A "Select Kernel" dialog is accepted if one appears (it can block the kernel from starting). It also
    starts recording the kernel's execution state (JS_EXECUTION_STATE).
    """
    write_notebook(lab.root_dir, name, cells)
    page.goto(lab.notebook_url(name), wait_until="domcontentloaded", timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    ready = f"""(name) => {{ const w = {_NOTEBOOK};
        return w?.context?.path === name && w.sessionContext?.session?.kernel?.status === 'idle'; }}"""
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    while not page.evaluate(ready, name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: kernel not idle within {timeout:g} s (status {kernel_status(page)!r})")
        if accept.count():
            accept.first.click(timeout=5_000)
        page.wait_for_timeout(200)
    page.evaluate(_TRACK_EXECUTION)


def run_all(page: Page, timeout: float = 10.0) -> None:
    """Start notebook:run-all-cells and return once the run has begun, not when it ends.

    ``page.evaluate`` would await the command's promise, i.e. the whole run (gotcha 4), so the command is
    fired without returning its promise; the wait is for a cell to be queued or to get a new execution count.
    """
    before = page.evaluate(_EXECUTION_COUNTS)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    wait_for(page, f"""(before) => ({JS_RUNNING_CELLS})() > 0
        || JSON.stringify(({_EXECUTION_COUNTS})()) !== JSON.stringify(before)""", timeout, arg=before)


def wait_idle(page: Page, timeout: float) -> None:
    """Wait until no cell is queued or running and the kernel has finished executing."""
    wait_for(page, f"() => ({JS_RUNNING_CELLS})() === 0 && ({JS_EXECUTION_STATE})() !== 'busy'", timeout)


def cell_locator(page: Page, index: int) -> Locator:
    """A Playwright Locator for cell ``index`` (0-based) of the notebook in view."""
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def cell_output_text(page: Page, index: int) -> str:
    """The text of cell ``index``'s output area (0-based), as rendered; "" if it has none yet."""
    return page.evaluate(JS_CELL_OUTPUT_TEXT, index)


def wait_for_output(page: Page, index: int, text: str, timeout: float) -> str:
    """Wait until cell ``index``'s output contains ``text``; return the whole output text."""
    return wait_for(page, f"""([i, text]) => {{ const out = ({JS_CELL_OUTPUT_TEXT})(i);
        return out.includes(text) ? out : null; }}""", timeout, arg=[index, text])
