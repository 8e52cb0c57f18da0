#!/usr/bin/env bash
# Checks a neuron_lab wheel (`make wheel`) as a user without a compiler gets it: prints what `auditwheel show` says
# of it, installs it into a fresh venv whose PATH has no compiler, then loads the extension in IPython, runs an op on
# `neuron`, and fails unless the compiled core the wheel carries is the one serving it (the pure-Python core would
# mean the core was not in the wheel, or does not load against this torch), the wheel is platform-tagged and
# requires the torch minor it was built for, and the installed `neuron-lab doctor` says the compiled core loaded.
# Last, the installed core's record is made to name another torch minor, as a wheel meeting another torch sees it:
# `neuron-lab doctor` must say so and run the pure-Python core.
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

echo "wheel: $(basename "$wheel")"
# a pure wheel has nothing to show (and fails below, on the core); its words are printed either way. show knows no
# exclusions: torch's libraries, which the core links and `make wheel` leaves to the torch wheel, are external to it,
# so it names linux_x86_64; the tag the core's symbol versions allow is the one `auditwheel repair` gave.
"$python" -m auditwheel show "$wheel" 2>&1 || true
"$python" - "$wheel" <<'EOF'
import fnmatch, json, subprocess, sys

shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", sys.argv[1]], capture_output=True,
                       text=True)
if shown.returncode == 0:
    d = json.loads(shown.stdout)
    libs = sorted(d["external_libs"])
    others = [lib for lib in libs if not fnmatch.fnmatch(lib, "libtorch*.so") and lib != "libc10.so"]
    assert not others, f"the core links libraries neither the wheel nor torch carries: {others}"
    print(f"auditwheel: the external libraries are torch's ({', '.join(libs)}); symbol versions allow {d['sym_tag']}")
EOF

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

from importlib.metadata import distribution

import torch

meta = distribution("neuron_lab")
tags = [ln.split(": ", 1)[1] for ln in meta.read_text("WHEEL").splitlines() if ln.startswith("Tag: ")]
assert tags and not [t for t in tags if t.endswith("-none-any")], f"the wheel carries the core but is tagged {tags}"
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
(pin,) = [r for r in meta.requires if r.split(";")[0].replace(" ", "").startswith("torch")]
want = {f">={major}.{minor}", f"<{major}.{minor + 1}"}
assert set(pin.removeprefix("torch").split(",")) == want, f"the wheel requires {pin!r}, not torch {major}.{minor}"
print(f"wheel ok: %load_ext neuron_lab, an op on neuron, the compiled core ({os.path.relpath(loaded[0], sys.prefix)})"
      f" in a venv with no compiler; tagged {', '.join(tags)}; requires {pin}")
EOF
in_venv() { (cd "$tmp" && env -i HOME="$tmp" PATH="$tmp/venv/bin" "$@"); }
core_line() { in_venv neuron-lab doctor | grep '^  core ' | sed 's/^  core *//'; }
in_venv "$tmp/venv/bin/python" smoke.py

line=$(core_line)
echo "neuron-lab doctor: core $line"
[[ $line == "compiled: compiled core loaded" ]] || { echo "doctor does not say the compiled core loaded" >&2; exit 1; }

# The core as a wheel meeting another torch minor meets it: its record names torch X.(Y-1).
record="$venv_site/neuron_lab/backend/emulator/_core_torch.py"
[[ -f $record ]] || { echo "the wheel has no core record ($record)" >&2; exit 1; }
read -r this other < <(in_venv python -c \
  "import torch; a, b = map(int, torch.__version__.split('.')[:2]); print(f'{a}.{b}', f'{a}.{b - 1}')")
echo "TORCH_VERSION = \"$other.0\"" > "$record"
line=$(core_line)
echo "neuron-lab doctor, the record saying torch $other: core $line"
want="python: built for torch $other, this is torch $this: running the pure-Python core"
[[ $line == "$want"* ]] || { echo "doctor does not say: $want" >&2; exit 1; }
