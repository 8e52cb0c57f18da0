"""Every setting neuron_lab reads, registered once: the environment variables and the ``%config NeuronLab.*`` traits.

As ``torch/_logging/_registrations.py`` does for logs, each setting is one registration call below with its type,
default, meaning and readers. The modules that read a variable get it here (``env("NEURON_LAB_CORE").choice()``),
``neuron-lab doctor`` and the reference in ``docs/configuration.md`` (``tools/readme_reference.py``) list it from
here, and a bad value is reported in the words built here, so no list of settings is kept by hand anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

_FALSE = ("", "0", "false", "False")  # what a flag variable reads as off
_ON, _OFF = ("1", "true"), ("0", "false")  # what a switch takes, in any case


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: what it means, what it takes, and which modules read it."""

    name: str
    meaning: str  # one line for `neuron-lab doctor` and docs/configuration.md, after the choices when there are any
    readers: tuple[str, ...]  # the modules that read it (setup.py reads NEURON_LAB_BUILD_CORE at install)
    choices: tuple[str, ...] = ()
    default: str | None = None
    fold_case: bool = True  # a choice is read case-insensitively ("AUTO" is auto)
    listed: bool = True  # shown by doctor and docs/configuration.md; a launcher's own variables (LOCAL_RANK) are not
    torchneuron: bool = False  # TorchNeuron's own setting that neuron_lab never reads, shown apart by doctor

    @property
    def summary(self) -> str:
        """The doctor/docs line: ``auto|emulator|off: which backend serves `neuron```."""
        return f"{'|'.join(self.choices)}: {self.meaning}" if self.choices else self.meaning

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The value as set (``os.environ`` unless ``env`` is given), None when unset."""
        return (os.environ if env is None else env).get(self.name)

    def text(self, env: Mapping[str, str] | None = None) -> str:
        """The value without surrounding blanks; "" when unset."""
        return (self.raw(env) or "").strip()

    def flag(self, env: Mapping[str, str] | None = None) -> bool:
        """On unless ``0`` or ``false``; unset or empty, as its default says (no default: off)."""
        return ((self.raw(env) or "").strip() or self.default or "") not in _FALSE

    def switch(self, env: Mapping[str, str] | None = None) -> tuple[bool, str | None]:
        """On or off (the default when unset or blank) and, for a value that is neither, the problem to report;
        the default is used instead of it. Unlike :meth:`flag`, a typo ("maybe") is not read as on."""
        raw = self.raw(env)
        value = (raw or "").strip().lower()
        if value in _ON or value in _OFF:
            return value in _ON, None
        if not value:
            return self.default in _ON, None
        return self.default in _ON, f"{self.name}={raw!r} is not one of {', '.join(_ON + _OFF)}; using {self.default}"

    def choice(self, env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
        """The chosen value (the default when unset or blank) and, for a value not among the choices, the problem
        to report; the default is used instead of it."""
        raw = self.raw(env)
        value = (raw or "").strip()
        value = value.lower() if self.fold_case else value
        if not value:
            return self.default, None
        if value not in self.choices:
            return self.default, f"{self.not_one_of(raw)}; using {self.default}"
        return value, None

    def not_one_of(self, value: str | None) -> str:
        """The bad-value message: ``NEURON_LAB_CORE='gpu' is not one of auto, compiled, python``."""
        return f"{self.name}={value!r} is not one of {', '.join(self.choices)}"

    def setdefault(self, value: str) -> str:
        """Set it in this process unless the user did; the value now in force."""
        return os.environ.setdefault(self.name, value)


@dataclass(frozen=True)
class ConfigSetting:
    """One ``%config NeuronLab.<name>`` setting; ``session/config.py`` makes it a traitlets trait."""

    name: str
    type: type
    default: object
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def out_of_range(self, value: float) -> str | None:
        """The bad-value message for a number outside the bounds, None inside them."""
        lo, hi = self.minimum, self.maximum
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return None
        bounds = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
        return f"NeuronLab.{self.name} must be {bounds}, not {value}"


ENV: dict[str, EnvVar] = {}
CONFIG: dict[str, ConfigSetting] = {}


def register_env(name: str, meaning: str, *readers: str, **kw) -> EnvVar:
    if name in ENV:
        raise ValueError(f"environment variable {name} is registered twice")
    ENV[name] = var = EnvVar(name, meaning, readers, **kw)
    return var


def register_config(name: str, type_: type, default: object, help: str, **kw) -> ConfigSetting:
    if name in CONFIG:
        raise ValueError(f"setting NeuronLab.{name} is registered twice")
    CONFIG[name] = setting = ConfigSetting(name, type_, default, help, **kw)
    return setting


def env(name: str) -> EnvVar:
    """The registered variable ``name``; a name nobody registered is a KeyError, not a silent ``None``."""
    return ENV[name]


def config(name: str) -> ConfigSetting:
    return CONFIG[name]


def listed() -> list[EnvVar]:
    """The variables ``neuron-lab doctor`` and ``docs/configuration.md`` show, in registration order."""
    return [v for v in ENV.values() if v.listed]


def torchneuron() -> list[EnvVar]:
    """TorchNeuron's own settings (listed ones), which doctor shows apart from neuron_lab's."""
    return [v for v in listed() if v.torchneuron]


# -- environment variables: neuron_lab's own first, then those of TorchNeuron, the Neuron runtime, PyTorch ----------
B, E = "neuron_lab.backend", "neuron_lab.backend.emulator"
register_env("NEURON_LAB_BACKEND", "which backend serves `neuron`", f"{B}.selection", "neuron_lab.runner.main",
             choices=("auto", "emulator", "off"), default="auto")
register_env("NEURON_LAB_COVERAGE", "op coverage (which ops fall back): a bundled name or a JSON file",
             f"{B}.coverage", "neuron_lab.runner.main", default="torchneuron-combined")
register_env("NEURON_LAB_PROFILE", "the deprecated name of NEURON_LAB_COVERAGE, read when that is unset",
             f"{B}.coverage")
register_env("NEURON_LAB_DEVICE_MEMORY", "emulated capacity of each device (default: the instance's HBM per "
             "logical core)", f"{E}.topology")
register_env("NEURON_LAB_CORE", "which emulator core runs (auto: compiled when it loads)", f"{E}.cpp_core",
             choices=("auto", "compiled", "python"), default="auto")
register_env("NEURON_LAB_INSTANCE", "the emulated instance's devices (default trn2.3xlarge); each emulated host's "
             "own with `--instance`", f"{E}.topology", "neuron_lab.session.launch",
             choices=("trn2.3xlarge", "trn2.48xlarge", "trn1.2xlarge", "trn1.32xlarge"), default="trn2.3xlarge",
             fold_case=False)
register_env("NEURON_LOGICAL_NC_CONFIG", "logical NeuronCore size (LNC) of the emulated instance", f"{E}.topology",
             choices=("1", "2"))
register_env("NEURON_RT_VIRTUAL_CORE_SIZE", "the older name of NEURON_LOGICAL_NC_CONFIG", f"{E}.topology",
             choices=("1", "2"), listed=False)
register_env("NEURON_LAB_BUILD_CORE", "0 at install time: skip building the compiled core", "setup.py",
             default="1")
register_env("NEURON_LAB_EMULATE_DOWNCAST", "TorchNeuron's 64-bit rule: 1 (default) computes float64 ops in "
             "float32 and int64 ops in int32 (values past int32 wrap; copies keep int64) as TorchNeuron does; 0 keeps "
             "64-bit exact", E, default="1")
register_env("NEURON_LAB_COMPILE_LOWERING", "how the emulator runs compiled graphs (default eager: op by op on the "
             "device, fast compiles, per-op reports; inductor: host Inductor, compiled speed)", f"{E}.lowering",
             "neuron_lab.session.config", choices=("eager", "inductor"), default="eager", fold_case=False)
register_env("NEURON_LAB_ABORTS", "an op on a parameter that a public report saw abort the process on TorchNeuron "
             "(the coverage's aborts): warn (default) reports it as an error-level row and warns once per op and line; "
             "raise stops the op before it runs; off says nothing", f"{E}.aborts",
             choices=("warn", "raise", "off"), default="warn")
register_env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0 disables PyTorch's backend autoload", "neuron_lab.cli",
             default="1")
# TorchNeuron's own, as users tune them (tnx docs/environment_variables.md and the code that reads each); the ones
# torch_neuronx sets at import when unset (tnx torch_neuronx/__init__.py:44-65) say so: doctor shows who set them.
_tnx = dict(torchneuron=True)
register_env("NEURON_LAUNCH_BLOCKING", "1: TorchNeuron runs device work and NEFF compiles synchronously, so a "
             "compile's time lands where it happens (torch_neuronx sets it at import: RELEASE builds 1, DEV 0)", **_tnx)
register_env("TORCH_NEURONX_ENABLE_ASYNC_NRT", "1: TorchNeuron submits work to the Neuron runtime asynchronously "
             "(torch_neuronx sets 1 at import)", **_tnx)
register_env("TORCH_NEURONX_LOG_LEVEL", "TorchNeuron's log level, 0 to 3 (3: debug logs)", **_tnx)
register_env("TORCH_NEURONX_LOG_FILE", "a file TorchNeuron writes its log to", **_tnx)
register_env("TORCH_NEURONX_ENABLE_STACK_TRACE", "1: TorchNeuron captures a Python stack per op (overhead; "
             "torch_neuronx sets 0 at import)", **_tnx)
register_env("TORCH_NEURONX_NEFF_CACHE_DIR", "where TorchNeuron caches compiled NEFFs (default /tmp/neff_cache)",
             **_tnx)
register_env("TORCH_NEURONX_DISABLE_NEFF_CACHE", "1: no NEFF cache, every graph is compiled again", **_tnx)
register_env("TORCH_NEURONX_DEBUG_DIR", "where torch.compile(backend='neuron') writes FX graphs, StableHLO and NEFFs "
             "(default /tmp/neuron_backend_<uuid>)", **_tnx)
register_env("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1: keep those compile artefacts after execution",
             **_tnx)
register_env("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", "1: an op TorchNeuron implements raises when its "
             "implementations fail or cannot take the arguments, instead of running on the CPU; ops it has no kernel "
             "for still fall back (torch_neuronx sets it at import: DEV builds 1, RELEASE 0)", **_tnx)
register_env("NEURON_RT_ENABLE_HOST_CC", "1: the runtime's host collectives, without which TorchNeuron gives every "
             "new stream the default one", **_tnx)
register_env("TORCH_NEURONX_ENABLE_HOST_CC", "the name beta users give NEURON_RT_ENABLE_HOST_CC (the April 2026 "
             "source reads only that one)", **_tnx)
register_env("TORCH_NEURONX_METRICS_ENABLED", "1: TorchNeuron collects its metrics (torch_neuronx.metrics) from "
             "start-up", **_tnx)
register_env("TORCH_NEURONX_ENABLED_METRIC_TABLES", "comma-separated TorchNeuron metric tables to export as CSV",
             **_tnx)
register_env("TORCH_NEURONX_METRICS_DIR", "where TorchNeuron writes metric CSVs (default /tmp)", **_tnx)
del _tnx
# TorchNeuron's and the runtime's that the emulator reads too: listed with neuron_lab's own
register_env("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1 (unset: TorchNeuron 2.33's default): a compiled graph "
             "that fails to compile raises; 0: it runs eagerly instead (the emulator does the same for a graph with "
             "an op TorchNeuron would not lower)", f"{E}.unlowered")
register_env("NEURON_RT_VISIBLE_CORES", "NeuronCores this process may use (TorchNeuron and the emulator)",
             f"{E}.topology", f"{E}.distributed")
register_env("NEURON_RT_ROOT_COMM_ID", "host:port of rank 0, where the Neuron runtime's collectives bootstrap; set "
             "alike on every rank by `%neuron ranks` and `neuron-lab run --nproc` (the preflight table shows it)",
             "neuron_lab.session.placement", "neuron_lab.session.preflight")
register_env("NEURON_RT_NUM_CORES", "how many NeuronCores this process takes (TorchNeuron and the emulator)",
             f"{E}.topology")
register_env("KINETO_LOG_LEVEL", "torch.profiler's log level; neuron_lab sets 6 (silent: no `USDT: ... "
             "profiler_start` lines under profiled cells) where it is not set; 0 shows everything",
             "neuron_lab.trace.profile")
# a launcher's (torchrun, mp.spawn, `neuron-lab run --nproc`): read, never set by a user
register_env("LOCAL_RANK", "this process's rank on its host", f"{E}.topology", f"{E}.distributed",
             "neuron_lab.runner.kernel", listed=False)
register_env("LOCAL_WORLD_SIZE", "how many ranks run on this host", f"{E}.topology", listed=False)
register_env("NEURON_LAB_RANKS_ENGINES", "the engines `%neuron ranks start N` starts when it is not given "
             "--engines (`neuron-lab run --engines` sets it for a notebook's kernel)", "neuron_lab.magics",
             choices=("local", "mpi", "slurm", "ssh"), default="local")
register_env("NEURON_LAB_RANKS_SSH_HOSTS", "the hosts `%neuron ranks start N` starts ssh engines on when it is not "
             "given --ssh-hosts (`neuron-lab run --ssh-hosts` sets it for a notebook's kernel)", "neuron_lab.magics")
register_env("NEURON_LAB_RANKS_ADDRESS", "the address at which `%neuron ranks` engines on other hosts reach the "
             "notebook's controller and rendezvous store (their MASTER_ADDR), when NeuronLab.ranks_address is not "
             "set; default: loopback for engines on this machine, else as docs/distributed.md says",
             "neuron_lab.session.ranks_address")
register_env("NEURON_LAB_SSH_HOST", "the index of the host an ssh engine was started on, in `--ssh-hosts` order "
             "(set by `%neuron ranks start N --engines ssh`)", "neuron_lab.session.ssh_engines", listed=False)
register_env("NEURON_LAB_HOST", "the emulated host this rank is on (one per host of `--nnodes M`, `--hosts M`)",
             "neuron_lab.session.placement", listed=False)
register_env("RANK", "this process's global rank", f"{E}.neuronx.profiling", "neuron_lab.agent", listed=False,
             default="0")
del B, E

# -- %config NeuronLab.<name> -----------------------------------------------------------------------------------------
register_config("auto_report", bool, True, "Show a report after every cell that touched the device.")
register_config("report_detail", str, "table", "How much an automatic report shows: one line, tables, or tables "
                "with stacks.", choices=("summary", "table", "full"))
register_config("callsites", bool, True, "Find the cell line behind each CPU fallback (a frame walk per fallback "
                "call).")
register_config("callsite_stacks", int, 3, "Stacks captured for the first K calls of each (op, line); 0 captures "
                "none.", minimum=0)
register_config("stack_depth", int, 8, "Frames kept per captured stack.", minimum=0)
register_config("device_variable", str, "device", "The user-namespace variable that holds the notebook's device.")
register_config("history_size", int, 500, "Cell reports kept for `%neuron report`; the oldest go first.", minimum=0)
register_config("widget_refresh_hz", float, 4.0, "How often live widgets refresh while a cell runs.", minimum=0.1,
                maximum=60)
register_config("memory_sample_ms", float, 20.0, "How often the memory timeline reads the device's allocated bytes "
                "while a cell runs, views open or not (a counter read on a background thread); 0 reads them only at "
                "each cell's start and end.", minimum=0, maximum=1000)
register_config("compile_progress_s", float, 0.7, "A compile running this long shows a line in its cell saying what "
                "it does (loading the compiler, compiling a module, lowering a graph) and for how long, until the "
                "report replaces it; 0 shows every compile's, a large value none.", minimum=0)
register_config("ranks_output_window_s", float, 0.5, "How long a line one rank of a `%%neuron ranks` cell printed "
                "waits for the other ranks to print it too, to be shown once with their ranks; then it is shown with "
                "the ranks that printed it by then.", minimum=0)
register_config("ranks_address", str, "", "The address at which `%neuron ranks` engines reach the notebook's "
                "ipyparallel controller and the ranks' rendezvous store (their MASTER_ADDR); empty: "
                "NEURON_LAB_RANKS_ADDRESS, else loopback for engines on this machine, the interface routing to the "
                "first ssh host, or the FQDN for Slurm.")
register_config("auto_dashboard", bool, False, "Show a compact live strip (memory bar, fallback count, mode) under "
                "each cell while it runs (widget frontends).")
register_config("display_as", str, "auto", "How the live views show: widgets (auto: under a kernel) or static "
                "text/HTML updated after each cell (auto: elsewhere).", choices=("auto", "widget", "static"))
register_config("oom_traceback", str, "short", "After the device's out-of-memory error: 'short' skips nn.Module's "
                "call plumbing, ends the traceback in your code and frees what the failing frames held once the "
                "report lists it; 'full' keeps the "
                "emulator's frames and their tensors (for %debug; `%neuron free` drops them).",
                choices=("short", "full"))
register_config("compile_backend", str, "neuron", "The torch.compile backend of compile mode when none is given.")
register_config("compile_lowering", str, "eager", "How the emulator runs torch.compile(backend='neuron') graphs: "
                "eager runs each graph op by op on the device (fast compiles, per-op reports and CPU fallbacks "
                "inside graphs); inductor compiles them with host Inductor (compiled speed, slow compiles). "
                "Default: NEURON_LAB_COMPILE_LOWERING, else eager.", choices=ENV["NEURON_LAB_COMPILE_LOWERING"].choices)
