"""``neuron-lab doctor --check``: the self-test a user runs on a Trn instance, here on the emulator (every check
passes, on either core: `make test` runs it on both) and over the TorchNeuron stand-in (every check, the device's
profile artefacts included)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from fake_torchneuronx import BIN, SITE, run

CHECKS = ["runtime untouched by loading the extension", "memory read from the nested memory_stats",
          "a CPU fallback reported, as the device's own account says", "a compile timed",
          "a profile with device activity or the device's own artefacts",
          "two ranks join the neuron process group after loading the extension"]


def verdicts(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"^  (ok|FAIL)\s+(.+)$", text, re.M)}


def test_every_check_passes_on_the_emulator() -> None:
    r = subprocess.run([sys.executable, "-m", "neuron_lab", "doctor", "--check"], capture_output=True, text=True,
                       timeout=600, env={**__import__("os").environ, "NEURON_LAB_BACKEND": "emulator"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert verdicts(r.stdout) == dict.fromkeys(CHECKS, "ok"), r.stdout
    assert "  6 of 6 checks passed" in r.stdout and "Traceback" not in r.stdout
    assert "get_fallback_ops() ['aten::atan2.out']" in r.stdout  # TorchNeuron's own spelling, overload included


@pytest.mark.core_in_child  # the stand-in's child gets no NEURON_LAB_ variables: the same run in either pass
def test_every_check_passes_over_the_stand_in() -> None:
    r = run(argv=[str(BIN / "neuron-lab"), "doctor", "--check"], site=SITE, timeout=600)
    seen = verdicts(r.out)
    assert list(seen) == CHECKS, r.out + r.err
    assert all(v == "ok" for v in seen.values()) and r.rc == 0, r.out
    assert "is_neuron_runtime_initialized() after %load_ext and a cell: False" in r.out
    assert "device compiler (NEFF) 0.25 s" in r.out  # the stand-in's neuronx-cc time, read as compile time
    assert "Traceback" not in r.out
