"""Builds the emulator's compiled core against the torch installed in this environment.

Install torch first, then this package without build isolation (``pip install --no-build-isolation .``),
so the core matches the torch it will run with. Without a compiler, or with NEURON_LAB_BUILD_CORE=0,
the package installs without it and the emulator runs its pure-Python core (``neuron-lab doctor`` says so).
With the core, the wheel is platform-tagged and requires the torch minor it was built against (its C++ ABI), and
the core's record (``_core_torch.py``) names that torch, so a wheel meeting another torch runs the pure-Python core.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

CSRC = Path("neuron_lab/backend/emulator/csrc")
CORE_RECORD = "_core_torch.py"  # beside the core: the torch it was built against (cpp_core.py reads it)
STARTUP_PTH = "neuron_lab-torch_neuronx.pth"  # lets `import torch_neuronx` come first (_neuron_lab_torch_neuronx.py)


class BuildPy(build_py):
    """Also puts the start-up ``.pth`` at the top of the wheel, so it lands in site-packages; leaves out a core record
    an in-place build left in the sources (build_ext writes the one for the core it builds)."""

    def run(self) -> None:
        super().run()
        self.copy_file(STARTUP_PTH, os.path.join(self.build_lib, STARTUP_PTH))
        record = os.path.join(self.build_lib, str(CSRC.parent), CORE_RECORD)
        if os.path.exists(record):
            os.remove(record)

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


# The dependencies; torch's range is the one the pure-Python core supports, narrowed to one minor with the core.
TORCH = "torch>=2.13,<2.15"
DEPENDENCIES = ["numpy", "ipython>=8.12", "psutil", "traitlets", "ipykernel>=6.11", "ipywidgets", "anywidget",
                "nbclient>=0.8", "nbformat>=5.7", "nbconvert>=7",
                "ipyparallel>=9.2"]  # `%neuron ranks`: the engines a multi-rank cell runs on


def _core():
    """The compiled core's extension and build command, or none; decided here, before the build, because the
    wheel's metadata (its torch pin) is written before it."""
    if os.environ.get("NEURON_LAB_BUILD_CORE", "1") == "0":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths
    except ImportError:
        print("neuron_lab: torch is not importable at build time; the compiled core is not built "
              "(install torch first, then build with --no-build-isolation)", file=sys.stderr)
        return [], {}
    compiler = os.environ.get("CXX", "c++").split()[0]  # what torch's BuildExtension calls
    if shutil.which(compiler) is None:
        print(f"neuron_lab: no C++ compiler ({compiler}); the compiled core is not built", file=sys.stderr)
        return [], {}

    class OptionalBuild(BuildExtension):
        """A failed core build leaves a working package on the pure-Python core; a built one gets its record."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001  (torch headers missing, a compile error, ...)
                self.extensions.remove(ext)  # nothing to copy into the package
                print(f"neuron_lab: the compiled core was not built ({e}); the emulator will use its "
                      "pure-Python core", file=sys.stderr)

        def run(self) -> None:
            super().run()  # builds, and with --inplace then copies the core into the sources
            for ext in self.extensions:  # the core, if it was built
                record = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), CORE_RECORD)
                with open(record, "w", encoding="utf-8") as f:
                    f.write(f'"""Written by setup.py with the compiled core: the torch it was built against."""\n\n'
                            f'TORCH_VERSION = "{torch.__version__}"\n')

    ext = CppExtension(
        "neuron_lab.backend.emulator._core",
        sorted(str(p) for p in CSRC.rglob("*.cpp")),  # module.cpp, runtime/, aten/, profiler/
        # the core's own headers by component ("runtime/device.h"), and the profiler hooks' Kineto headers
        include_dirs=[str(CSRC.resolve()), os.path.join(include_paths()[0], "kineto")],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wno-unused-parameter"],
    )
    return [ext], {"build_ext": OptionalBuild}


def _torch_requirement(with_core: bool) -> str:
    """The built core's torch minor (``torch>=2.13,<2.14``), else the supported range."""
    if not with_core:
        return TORCH
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return f"torch>={major}.{minor},<{major}.{minor + 1}"


ext_modules, cmdclass = _core()
setup(ext_modules=ext_modules, cmdclass={**cmdclass, "build_py": BuildPy, "editable_wheel": EditableWheel},
      install_requires=[_torch_requirement(bool(ext_modules)), *DEPENDENCIES])
