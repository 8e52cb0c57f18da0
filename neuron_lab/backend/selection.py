"""Which `neuron` backend a process gets, decided from what is installed, never by importing it.

Importing ``torch_neuronx`` to probe would re-raise without the Neuron runtime, and PrivateUse1
can be claimed only once per process, so the decision reads distribution metadata and the
PrivateUse1 owner only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata

from neuron_lab import settings

_BACKEND = settings.env("NEURON_LAB_BACKEND")
BACKEND_ENV, CHOICES = _BACKEND.name, _BACKEND.choices
NATIVE_MIN_VERSION = (2, 13, 3)  # torch-neuronx below this is the legacy XLA library
EMULATOR, TORCHNEURON, NONE = "emulator", "torchneuron", "none"


@dataclass
class Decision:
    kind: str  # EMULATOR | TORCHNEURON | NONE
    reason: str
    torchneuron_version: str | None = None
    problems: list[str] = field(default_factory=list)  # autoload or configuration trouble, for `doctor`


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch in "0123456789")
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


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
    if version == "":
        problems.append("torch-neuronx is installed but its metadata has no Version (a broken install?); "
                        "treating it as the legacy XLA library")
    owner = _privateuse1_owner()

    if choice == "off":
        return Decision(NONE, f"{BACKEND_ENV}=off", version, problems)
    if owner not in ("privateuseone", "neuron"):
        return Decision(NONE, f"PrivateUse1 already belongs to the {owner!r} backend; neuron_lab stays off",
                        version, problems)
    native = version is not None and _version_tuple(version) >= NATIVE_MIN_VERSION
    if choice == "emulator":
        if owner == "neuron" and not _emulator_owns_neuron():
            # PyTorch ran torch-neuronx's autoload before ours (entry point order is unspecified),
            # and PrivateUse1 is claimed once per process: the emulator cannot take over any more.
            how = ("set TORCH_DEVICE_BACKEND_AUTOLOAD=0 and `import neuron_lab` before anything imports "
                   "torch_neuronx")
            if native:
                problems.append(f"{BACKEND_ENV}=emulator was not honoured: torch-neuronx {version} registered "
                                f"'neuron' before neuron_lab loaded; {how}")
                return Decision(TORCHNEURON, f"torch-neuronx {version} registered 'neuron' first in this process "
                                             f"({BACKEND_ENV}=emulator could not take over)", version, problems)
            return Decision(NONE, f"{BACKEND_ENV}=emulator, but another backend registered 'neuron' first "
                                  f"in this process ({how})", version, problems)
        why = f"{BACKEND_ENV}=emulator"
        if native:
            why += f" (overrides the installed torch-neuronx {version})"
        return Decision(EMULATOR, why, version, problems)
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
