"""Builds the emulator's compiled core against the torch installed in this environment.

Install torch first, then this package without build isolation (``pip install --no-build-isolation .``),
so the core matches the torch it will run with. Without a compiler, or with NEURON_LAB_BUILD_CORE=0,
the package installs without it and the emulator runs its pure-Python core (``neuron-lab doctor`` says so).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

CSRC = Path("neuron_lab/backend/emulator/csrc")
STARTUP_PTH = "neuron_lab-torch_neuronx.pth"  # lets `import torch_neuronx` come first (_neuron_lab_torch_neuronx.py)


class BuildPy(build_py):
    """Also puts the start-up ``.pth`` at the top of the wheel, so it lands in site-packages."""

    def run(self) -> None:
        super().run()
        self.copy_file(STARTUP_PTH, os.path.join(self.build_lib, STARTUP_PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, STARTUP_PTH)]


class EditableWheel(editable_wheel):
    """``pip install -e`` too puts the start-up ``.pth`` in site-packages: an editable wheel holds only what its
    strategy writes (setuptools' own path hook), so the ``.pth`` is written beside it. The module it imports is
    found through that hook, whose ``.pth`` (``__editable__.*``) sorts, and so runs, first."""

    def _select_strategy(self, *args, **kwargs):
        return _WithStartupPth(super()._select_strategy(*args, **kwargs))


class _WithStartupPth:
    """An editable strategy (setuptools' ``EditableStrategy`` protocol) that also writes the start-up ``.pth``."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def __call__(self, wheel, files, mapping) -> None:
        self.strategy(wheel, files, mapping)
        wheel.write(STARTUP_PTH, STARTUP_PTH)

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self.strategy.__exit__(*exc)


def _core():
    if os.environ.get("NEURON_LAB_BUILD_CORE", "1") == "0":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths
    except ImportError:
        print("neuron_lab: torch is not importable at build time; the compiled core is not built "
              "(install torch first, then build with --no-build-isolation)", file=sys.stderr)
        return [], {}

    class OptionalBuild(BuildExtension):
        """A failed core build leaves a working package on the pure-Python core."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  (compiler missing, torch headers missing, ...)
                self.extensions.remove(ext)  # nothing to copy into the package
                print(f"neuron_lab: the compiled core was not built ({e}); the emulator will use its "
                      "pure-Python core", file=sys.stderr)

    ext = CppExtension(
        "neuron_lab.backend.emulator._core",
        sorted(str(p) for p in CSRC.rglob("*.cpp")),  # module.cpp, runtime/, aten/, profiler/
        # the core's own headers by component ("runtime/device.h"), and the profiler hooks' Kineto headers
        include_dirs=[str(CSRC.resolve()), os.path.join(include_paths()[0], "kineto")],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wno-unused-parameter"],
    )
    return [ext], {"build_ext": OptionalBuild}


ext_modules, cmdclass = _core()
setup(ext_modules=ext_modules, cmdclass={**cmdclass, "build_py": BuildPy, "editable_wheel": EditableWheel})
