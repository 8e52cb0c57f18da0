"""Which `neuron` devices the emulator presents, as the Neuron runtime would on a Trn instance.

An instance has chips of physical NeuronCores and HBM; at logical-core size ``LNC`` every ``LNC``
physical cores form one logical NeuronCore, which TorchNeuron shows as one ``neuron:i`` device with
its share of the HBM. ``NEURON_RT_VISIBLE_CORES`` and ``NEURON_RT_NUM_CORES`` then select devices as
the runtime does. Bad settings never stop the emulator: they fall back to the defaults and are
reported as problems for ``neuron-lab doctor`` and the load banner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from neuron_lab.units import format_size, parse_size

GiB = 1024**3
INSTANCE_ENV = "NEURON_LAB_INSTANCE"
CAPACITY_ENV = "NEURON_LAB_DEVICE_MEMORY"
LNC_ENVS = ("NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VIRTUAL_CORE_SIZE")
VISIBLE_ENV = "NEURON_RT_VISIBLE_CORES"
NUM_ENV = "NEURON_RT_NUM_CORES"
MAX_CAPACITY = 1 << 50  # 1 PiB: larger values are typing mistakes, not devices
MAX_DEVICES = 127  # PyTorch's device index is an int8


@dataclass(frozen=True)
class Instance:
    name: str
    chips: int
    cores_per_chip: int  # physical NeuronCores
    hbm_per_chip: int
    lnc_default: int
    lnc_choices: tuple[int, ...]


INSTANCES = {i.name: i for i in (
    Instance("trn2.3xlarge", 1, 8, 96 * GiB, 2, (1, 2)),
    Instance("trn2.48xlarge", 16, 8, 96 * GiB, 2, (1, 2)),
    Instance("trn1.2xlarge", 1, 2, 32 * GiB, 1, (1,)),
    Instance("trn1.32xlarge", 16, 2, 32 * GiB, 1, (1,)),
)}
DEFAULT_INSTANCE = "trn2.3xlarge"


@dataclass
class Topology:
    instance: str
    lnc: int
    capacities: list[int]  # one per visible device, neuron:0 first
    cores: list[int]  # the logical core each device is, as the runtime numbers them
    problems: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        caps = {format_size(c) for c in self.capacities}
        return (f"{self.instance} at LNC={self.lnc}: {len(self.capacities)} device(s) of "
                f"{', '.join(sorted(caps))}")


def _whole(text: str) -> bool:
    """ASCII digits only: ``"²".isdigit()`` is true, but ``int("²")`` fails."""
    return text.isascii() and text.isdigit()


def _core_list(text: str, limit: int) -> list[int]:
    """``"0-1,3"`` -> [0, 1, 3], as NEURON_RT_VISIBLE_CORES is written."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not _whole(lo) or (sep and not _whole(hi)):
            raise ValueError(f"{part!r} is not a core number or range")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first > last:
            raise ValueError(f"range {part!r} runs backwards")
        if last >= limit:
            raise ValueError(f"core {last} does not exist ({limit} logical cores: 0-{limit - 1})")
        cores.extend(c for c in range(first, last + 1) if c not in cores)
    return cores


def parse_capacity(text: str) -> int:
    """A positive, finite size such as ``24GiB``; ValueError otherwise."""
    try:
        n = parse_size(text)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{text!r} is not a size ({e})") from None
    if not isinstance(n, int) or n <= 0 or n > MAX_CAPACITY:
        raise ValueError(f"{text!r} is not a usable capacity (give a size above 0 and at most 1 PiB, e.g. 24GiB)")
    return n


def detect(env: dict[str, str] | None = None) -> Topology:
    """The devices this process gets, from the environment; never raises."""
    env = os.environ if env is None else env
    problems: list[str] = []
    name = env.get(INSTANCE_ENV, "").strip() or DEFAULT_INSTANCE
    inst = INSTANCES.get(name)
    if inst is None:
        problems.append(f"{INSTANCE_ENV}={name!r} is not one of {', '.join(INSTANCES)}; using {DEFAULT_INSTANCE}")
        inst = INSTANCES[DEFAULT_INSTANCE]
    lnc = inst.lnc_default
    for var in LNC_ENVS:
        raw = env.get(var, "").strip()
        if not raw:
            continue
        if _whole(raw) and int(raw) in inst.lnc_choices:
            lnc = int(raw)
        else:
            problems.append(f"{var}={raw!r}: {inst.name} takes LNC {' or '.join(map(str, inst.lnc_choices))}; "
                            f"using {lnc}")
        break
    physical = inst.chips * inst.cores_per_chip
    logical = physical // lnc
    capacity = inst.hbm_per_chip * inst.chips // logical
    raw_cap = env.get(CAPACITY_ENV, "").strip()
    if raw_cap:
        try:
            capacity = parse_capacity(raw_cap)
        except ValueError as e:
            problems.append(f"{CAPACITY_ENV}: {e}; using {format_size(capacity)}")
    cores = list(range(logical))
    visible = env.get(VISIBLE_ENV, "").strip()
    if visible:
        try:
            cores = _core_list(visible, logical)
        except ValueError as e:
            problems.append(f"{VISIBLE_ENV}={visible!r}: {e}; using all {logical} cores")
    num = env.get(NUM_ENV, "").strip()
    if num:
        if _whole(num) and 1 <= int(num) <= len(cores):
            cores = cores[:int(num)]
        else:
            problems.append(f"{NUM_ENV}={num!r}: give 1 to {len(cores)}; using {len(cores)}")
    if len(cores) > MAX_DEVICES:
        problems.append(f"{len(cores)} logical cores, but PyTorch numbers devices up to neuron:{MAX_DEVICES - 1}: "
                        f"the first {MAX_DEVICES} are visible (select others with {VISIBLE_ENV})")
        cores = cores[:MAX_DEVICES]
    return Topology(inst.name, lnc, [capacity] * len(cores), cores, problems)
