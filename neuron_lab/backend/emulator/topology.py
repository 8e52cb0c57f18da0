"""Which `neuron` devices the emulator presents, as the Neuron runtime would on a Trn instance.

An instance has chips of physical NeuronCores and HBM; at logical-core size ``LNC`` every ``LNC``
physical cores form one logical NeuronCore, which TorchNeuron shows as one ``neuron:i`` device with
its share of the HBM. ``NEURON_RT_VISIBLE_CORES`` and ``NEURON_RT_NUM_CORES`` then select devices as
the runtime does. Under ``torchrun`` (``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set) a process is one rank
and gets what TorchNeuron gives it: ``LOCAL_WORLD_SIZE`` device indices, of which it owns
``neuron:{LOCAL_RANK}``, on core ``NEURON_RT_VISIBLE_CORES`` (one core) or else core ``LOCAL_RANK``.
Bad settings never stop the emulator: they fall back to the defaults and are reported as problems for
``neuron-lab doctor`` and the load banner.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from neuron_lab import settings
from neuron_lab.units import format_size, parse_size

GiB = 1024**3
_INSTANCE, _CAPACITY = settings.env("NEURON_LAB_INSTANCE"), settings.env("NEURON_LAB_DEVICE_MEMORY")
_LNCS = (settings.env("NEURON_LOGICAL_NC_CONFIG"), settings.env("NEURON_RT_VIRTUAL_CORE_SIZE"))  # the first set wins
_VISIBLE, _NUM = settings.env("NEURON_RT_VISIBLE_CORES"), settings.env("NEURON_RT_NUM_CORES")
_LOCAL_RANK, _LOCAL_WORLD_SIZE = settings.env("LOCAL_RANK"), settings.env("LOCAL_WORLD_SIZE")
INSTANCE_ENV, CAPACITY_ENV, VISIBLE_ENV, NUM_ENV = _INSTANCE.name, _CAPACITY.name, _VISIBLE.name, _NUM.name
LNC_ENVS = tuple(v.name for v in _LNCS)
LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV = _LOCAL_RANK.name, _LOCAL_WORLD_SIZE.name
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
DEFAULT_INSTANCE = _INSTANCE.default


@dataclass
class Topology:
    instance: str
    lnc: int
    capacities: list[int]  # one per visible device, neuron:0 first
    cores: list[int]  # the logical core each device is, as the runtime numbers them
    problems: list[str] = field(default_factory=list)
    local_rank: int | None = None  # under torchrun: the one device index this process owns

    @functools.cached_property  # every report's backend description names it
    def summary(self) -> str:
        caps = {format_size(c) for c in self.capacities}
        rank = ("" if self.local_rank is None else
                f"; this rank owns neuron:{self.local_rank} (core {self.cores[self.local_rank]})")
        return (f"{self.instance} at LNC={self.lnc}: {len(self.capacities)} device(s) of "
                f"{', '.join(sorted(caps))}{rank}")


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
    name, problem = _INSTANCE.choice(env)
    problems = [problem] if problem else []
    inst = INSTANCES[name]
    lnc = inst.lnc_default
    for var in _LNCS:
        raw = var.text(env)
        if not raw:
            continue
        if _whole(raw) and int(raw) in inst.lnc_choices:
            lnc = int(raw)
        else:
            problems.append(f"{var.name}={raw!r}: {inst.name} takes LNC {' or '.join(map(str, inst.lnc_choices))}; "
                            f"using {lnc}")
        break
    physical = inst.chips * inst.cores_per_chip
    logical = physical // lnc
    capacity = inst.hbm_per_chip * inst.chips // logical
    raw_cap = _CAPACITY.text(env)
    if raw_cap:
        try:
            capacity = parse_capacity(raw_cap)
        except ValueError as e:
            problems.append(f"{CAPACITY_ENV}: {e}; using {format_size(capacity)}")
    cores = list(range(logical))
    visible = _VISIBLE.text(env)
    if visible:
        try:
            cores = _core_list(visible, logical)
        except ValueError as e:
            problems.append(f"{VISIBLE_ENV}={visible!r}: {e}; using all {logical} cores")
    num = _NUM.text(env)
    if num:
        if _whole(num) and 1 <= int(num) <= len(cores):
            cores = cores[:int(num)]
        else:
            problems.append(f"{NUM_ENV}={num!r}: give 1 to {len(cores)}; using {len(cores)}")
    ranked = _rank_topology(env, cores, logical, bool(visible), problems)
    if ranked is not None:
        local_rank, cores = ranked
        return Topology(inst.name, lnc, [capacity] * len(cores), cores, problems, local_rank)
    if len(cores) > MAX_DEVICES:
        problems.append(f"{len(cores)} logical cores, but PyTorch numbers devices up to neuron:{MAX_DEVICES - 1}: "
                        f"the first {MAX_DEVICES} are visible (select others with {VISIBLE_ENV})")
        cores = cores[:MAX_DEVICES]
    return Topology(inst.name, lnc, [capacity] * len(cores), cores, problems)


def _rank_topology(env: Mapping[str, str] | None, cores: list[int], logical: int, visible_set: bool,
                   problems: list[str]) -> tuple[int, list[int]] | None:
    """Under torchrun: (local rank, the core of each of the ``LOCAL_WORLD_SIZE`` devices), else None.

    Peers' devices are numbered as torchrun's default mapping (core = local rank) would place them.
    """
    rank, size = _LOCAL_RANK.text(env), _LOCAL_WORLD_SIZE.text(env)
    if not (rank or size):
        return None
    if not (_whole(rank) and _whole(size) and int(rank) < int(size) <= MAX_DEVICES):
        problems.append(f"{LOCAL_RANK_ENV}={rank!r} with {LOCAL_WORLD_SIZE_ENV}={size!r} is not a rank of a local "
                        f"world of 1 to {MAX_DEVICES}; not mapping this process to a rank's device")
        return None
    local_rank, size_ = int(rank), int(size)
    if size_ > logical:
        problems.append(f"{size_} local ranks but {logical} logical cores: a Trn instance could not start them")
    core = local_rank
    if visible_set:
        if len(cores) != 1:
            problems.append(f"{VISIBLE_ENV} gives rank {local_rank} {len(cores)} cores; TorchNeuron takes exactly "
                            f"one per process; using core {cores[0]}")
        core = cores[0]
    return local_rank, [core if i == local_rank else i for i in range(size_)]
