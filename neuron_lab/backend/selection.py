"""Which `neuron` backend a process gets, decided from what is installed, never by importing it.

Importing ``torch_neuronx`` to probe would re-raise without the Neuron runtime, and PrivateUse1
can be claimed only once per process, so the decision reads distribution metadata and the
PrivateUse1 owner only. Native TorchNeuron is known by its ``torch.backends`` entry point
(tnx pyproject.toml:14-15), which the legacy XLA library lacks: a DEV or source build is version
0.1.0, so no version number tells them apart. TorchNeuron registers `neuron` whenever it is
imported and never gives way (tnx torch_neuronx/__init__.py:67-72,119-128), so the emulator is
never installed beside it: asking for it there is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata

from neuron_lab import settings

_BACKEND = settings.env("NEURON_LAB_BACKEND")
BACKEND_ENV, CHOICES = _BACKEND.name, _BACKEND.choices
NATIVE_ENTRY_POINT = "torch_neuronx:_autoload"  # native TorchNeuron's torch.backends entry point
EMULATOR, TORCHNEURON, NONE = "emulator", "torchneuron", "none"


@dataclass
class Decision:
    kind: str  # EMULATOR | TORCHNEURON | NONE
    reason: str
    torchneuron_version: str | None = None
    problems: list[str] = field(default_factory=list)  # autoload or configuration trouble, for `doctor`


class UnreadableInstall(RuntimeError):
    """``torch-neuronx`` is installed, but its distribution metadata cannot be read."""


def installed_torchneuron() -> str | None:
    """The installed ``torch-neuronx`` version, None when not installed, "" when its metadata has none.

    Raises :class:`UnreadableInstall` when the metadata cannot be read (not UTF-8, unreadable file).
    """
    try:
        return metadata.version("torch-neuronx") or ""
    except metadata.PackageNotFoundError:
        return None
    except Exception as e:
        raise UnreadableInstall(f"torch-neuronx is installed but its metadata cannot be read "
                                f"({type(e).__name__}: {e}); reinstall it") from e


def declares_native_entry_point() -> bool:
    """Whether the installed ``torch-neuronx`` declares native TorchNeuron's ``torch.backends`` entry point."""
    try:
        eps = metadata.distribution("torch-neuronx").entry_points
    except Exception:  # not installed, or unreadable (installed_torchneuron says which)
        return False
    return any(ep.group == "torch.backends" and ep.value.replace(" ", "") == NATIVE_ENTRY_POINT for ep in eps)


def _privateuse1_owner() -> str:
    import torch

    return torch._C._get_privateuse1_backend_name()


def decide(env: dict[str, str] | None = None) -> Decision:
    choice, problem = _BACKEND.choice(env)
    problems = [problem] if problem else []
    try:
        version = installed_torchneuron()
    except UnreadableInstall as e:
        if choice == "auto":  # it may be a working TorchNeuron: the emulator must not take its device
            return Decision(NONE, f"{e}; neuron_lab stays off (NEURON_LAB_BACKEND=emulator uses the emulator)",
                            None, [*problems, str(e)])
        problems.append(str(e))
        version = None
    native = version is not None and declares_native_entry_point()
    if version == "" and not native:
        problems.append("torch-neuronx is installed but its metadata has no Version (a broken install?); "
                        "treating it as the legacy XLA library")
    owner = _privateuse1_owner()

    if choice == "off":
        return Decision(NONE, f"{BACKEND_ENV}=off", version, problems)
    if owner not in ("privateuseone", "neuron"):
        return Decision(NONE, f"PrivateUse1 already belongs to the {owner!r} backend; neuron_lab stays off",
                        version, problems)
    if choice == "emulator" and native:
        # Installed first, the emulator would make torch-neuronx's own import (its autoload, or any later
        # `import torch_neuronx`) fail, and with it `import torch`.
        problems.append(f"{BACKEND_ENV}=emulator refused: the native torch-neuronx {version} is installed and takes "
                        "the 'neuron' device whenever it is imported, so the emulator cannot sit beside it; use an "
                        "environment without torch-neuronx for the emulator")
        return Decision(TORCHNEURON, f"torch-neuronx {version} is installed (native TorchNeuron backend; "
                                     f"{BACKEND_ENV}=emulator refused)", version, problems)
    if choice == "emulator":
        if owner == "neuron" and not _emulator_owns_neuron():
            return Decision(NONE, f"{BACKEND_ENV}=emulator, but another backend registered 'neuron' first "
                                  "in this process", version, problems)
        return Decision(EMULATOR, f"{BACKEND_ENV}=emulator", version, problems)
    if native:
        return Decision(TORCHNEURON, f"torch-neuronx {version} is installed (native TorchNeuron backend)",
                        version, problems)
    if owner == "neuron" and not _emulator_owns_neuron():
        return Decision(NONE, "another package registered the 'neuron' device in this process", version, problems)
    if version is not None:
        return Decision(EMULATOR, f"torch-neuronx {version or '(no version)'} is the legacy XLA library, not "
                                  "TorchNeuron; using the bundled emulator", version, problems)
    return Decision(EMULATOR, "torch-neuronx is not installed: using the bundled emulator", version, problems)


def _emulator_owns_neuron() -> bool:
    from neuron_lab.backend.emulator import runtime

    return runtime.installed()
