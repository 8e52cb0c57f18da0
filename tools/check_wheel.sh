#!/usr/bin/env bash
# Checks a neuron_lab wheel (`make wheel`) as a user without a compiler gets it: installs it into a fresh venv
# whose PATH has no compiler, then loads the extension in IPython, runs an op on `neuron`, and fails unless the
# compiled core the wheel carries is the one serving it (the pure-Python core would mean the core was not in the
# wheel, or does not load against this torch).
#
# usage: tools/check_wheel.sh WHEEL
# PYTHON (default .venv/bin/python) makes the venv; its site-packages lend the dependencies (torch, IPython, ...),
# so nothing is downloaded: `pip install --no-index` resolves the wheel's requirements against them.
set -euo pipefail
wheel=$(realpath "${1:?usage: tools/check_wheel.sh WHEEL}")
python=${PYTHON:-.venv/bin/python}
deps=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -m venv --without-pip "$tmp/venv"
venv_site=$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$deps" > "$venv_site/zz_dependencies.pth"  # after the venv's own site-packages: the wheel's files win
# pip from the lending site-packages; it installs into the venv that runs it
(cd "$tmp" && env -u PYTHONPATH "$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  "$wheel")

cat > "$tmp/smoke.py" <<'EOF'
import os
import shutil
import sys

missing = [c for c in ("c++", "g++", "gcc", "cc", "clang") if shutil.which(c)]
assert not missing, f"a compiler is on PATH: {missing}"
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "neuron_lab")
result = shell.run_cell("import torch\ny = (torch.ones(3, device='neuron') * 2).sum().item()")
assert result.success, result.error_in_exec
assert shell.user_ns["y"] == 6.0, shell.user_ns["y"]

import neuron_lab
from neuron_lab.backend.emulator import runtime

assert neuron_lab.__file__.startswith(sys.prefix), f"neuron_lab came from {neuron_lab.__file__}, not the wheel"
core = runtime.get().core
assert core == "compiled", f"the {core} core serves `neuron`: the wheel's compiled core is missing or did not load"
loaded = [m.__file__ for m in sys.modules.values() if getattr(m, "__name__", "").endswith("emulator._core")]
print(f"wheel ok: %load_ext neuron_lab, an op on neuron, the compiled core ({os.path.relpath(loaded[0], sys.prefix)})"
      f" in a venv with no compiler")
EOF
(cd "$tmp" && env -i HOME="$tmp" PATH="$tmp/venv/bin" "$tmp/venv/bin/python" smoke.py)
