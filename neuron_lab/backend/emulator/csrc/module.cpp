// The Python face of the compiled core (`neuron_lab.backend.emulator._core`) over its runtime/ (devices, memory,
// guard, hooks, generators), aten/ (the fallback, kernels, policy) and profiler/, and the few calls the core
// makes into Python. Those take the GIL, and a Python exception raised in them (a KeyboardInterrupt
// delivered there included) travels back through the dispatcher and is re-raised unchanged.
#include "aten/dispatch.h"
#include "aten/host_alias.h"
#include "aten/unboxed.h"
#include "lines.h"
#include "profiler/profiler.h"
#include "runtime/allocator.h"
#include "runtime/clock.h"
#include "runtime/device.h"
#include "runtime/generator.h"

#include <array>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

namespace py = pybind11;

namespace torch {
// From torch/csrc/profiler/python/combined_traceback.h, whose other declarations need nlohmann/json, which torch's
// wheel does not ship: stacks to lists of {"filename", "line", "name"} dicts, as CUDA's memory snapshot has them.
TORCH_API std::vector<py::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
}  // namespace torch

namespace neuron_lab {
namespace {

// Owned references that are never released: the core outlives the interpreter's teardown.
PyObject* classify_fn = nullptr;
PyObject* deliver_fn = nullptr;
PyObject* site_fn = nullptr;
PyObject* abort_fn = nullptr;

[[noreturn]] void rethrow(py::error_already_set& e) {
  e.restore();
  python_error err;
  err.persist();
  throw std::move(err);
}

std::vector<std::string> kind_names;  // index -> name, from configure(): "native" and "downcast" first

int kind_index(const std::string& name) {
  for (size_t k = 0; k < kind_names.size(); ++k) {
    if (name == kind_names[k]) return static_cast<int>(k);
  }
  TORCH_CHECK(false, "neuron emulator: the coverage profile gave an unknown kind ", name);
}

py::tuple signature_tuple(const Signature& s) {
  py::list shapes;
  for (const auto& shape : s.shapes) shapes.append(py::tuple(py::cast(shape)));
  return py::make_tuple(py::tuple(shapes), py::tuple(py::cast(s.dtypes)));
}

void set_callback(PyObject*& slot, const py::object& fn) {
  Py_XINCREF(fn.ptr());
  Py_XDECREF(slot);
  slot = fn.is_none() ? nullptr : fn.ptr();
}

// The allocator's counters in the order of their flat "allocated_bytes.all.current" keys (CUDA's memory_stats keys),
// into values; how many. The keys are made at the first call, into flat_keys(), and no call after builds a string.
std::vector<py::object>& flat_keys() {
  static auto* keys = new std::vector<py::object>();  // never released, as the callbacks above
  return *keys;
}

size_t flat_counters(c10::DeviceIndex device, std::array<int64_t, 128>& values) {
  auto s = allocator().getDeviceStats(checked_index(device));
  auto* keys = &flat_keys();
  const bool naming = keys->empty();
  size_t n = 0;
  auto add = [&](auto&& name, int64_t value) {
    if (naming) keys->push_back(py::str(name()));
    values.at(n++) = value;
  };
  auto stat = [&](const char* key, const char* pool, const c10::CachingAllocator::Stat& st) {
    auto named = [&](const char* metric) {
      return [=] { return std::string(key) + "." + pool + (*pool ? "." : "") + metric; };
    };
    add(named("current"), st.current);
    add(named("peak"), st.peak);
    add(named("allocated"), st.allocated);
    add(named("freed"), st.freed);
  };
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (const auto& [key, arr] : {std::pair<const char*, const c10::CachingAllocator::StatArray*>{"allocated_bytes",
                                                                                              &s.allocated_bytes},
                                 {"active_bytes", &s.active_bytes},
                                 {"requested_bytes", &s.requested_bytes},
                                 {"reserved_bytes", &s.reserved_bytes},
                                 {"inactive_split_bytes", &s.inactive_split_bytes},
                                 {"allocation", &s.allocation},
                                 {"active", &s.active},
                                 {"segment", &s.segment},
                                 {"inactive_split", &s.inactive_split}}) {
    for (int p = 0; p < 3; ++p) stat(key, pools[p], (*arr)[p]);
  }
  stat("oversize_allocations", "", s.oversize_allocations);
  stat("oversize_segments", "", s.oversize_segments);
  add([] { return "max_split_size"; }, s.max_split_size);
  add([] { return "num_sync_all_streams"; }, s.num_sync_all_streams);
  add([] { return "num_alloc_retries"; }, s.num_alloc_retries);
  add([] { return "num_ooms"; }, s.num_ooms);
  add([] { return "num_device_alloc"; }, s.num_device_alloc);
  add([] { return "num_device_free"; }, s.num_device_free);
  return n;
}

// Every counter as a dict by its flat key (unsorted: the Python side sorts its own copy), made at its size.
py::dict flat_stats(c10::DeviceIndex device) {
  std::array<int64_t, 128> values;
  const size_t n = flat_counters(device, values);
  const auto& keys = flat_keys();
  auto out = py::reinterpret_steal<py::dict>(_PyDict_NewPresized(static_cast<Py_ssize_t>(n)));
  if (!out) throw py::error_already_set();
  for (size_t i = 0; i < n; ++i) {
    auto value = py::reinterpret_steal<py::object>(PyLong_FromLongLong(values[i]));
    if (!value || PyDict_SetItem(out.ptr(), keys[i].ptr(), value.ptr()) < 0) throw py::error_already_set();
  }
  return out;
}

// The counters named by keys (flat keys), as a tuple in their order: a memory reading (two a tracked cell, and each of
// the memory sampler's) without the dict of all of them. The keys' positions are found once per keys object (the
// caller's one tuple), which is held so that its identity stays its own.
py::tuple flat_values(c10::DeviceIndex device, const py::tuple& keys) {
  std::array<int64_t, 128> values;
  const size_t n = flat_counters(device, values);
  static auto* asked = new py::object();  // never released, as flat_keys()
  static auto* positions = new std::vector<size_t>();
  if (!asked->is(keys)) {
    const auto& names = flat_keys();
    std::vector<size_t> found;
    for (const auto& key : keys) {
      size_t i = 0;
      while (i < n && !names[i].equal(key)) ++i;
      if (i == n) throw py::key_error(py::str(key));
      found.push_back(i);
    }
    *positions = std::move(found);
    *asked = keys;
  }
  py::tuple out(positions->size());
  for (size_t i = 0; i < positions->size(); ++i) out[i] = py::int_(values[(*positions)[i]]);
  return out;
}

// A memory snapshot with the keys and values torch.cuda.memory._snapshot() gives, so PyTorch's memory_viz reads it.
// Every stack is symbolized in one call, as CUDA's snapshot does.
py::dict snapshot_dict(const MemorySnapshot& snap) {
  std::vector<torch::CapturedTraceback*> stacks;
  std::vector<py::dict> owners;
  auto frames = [&](py::dict& d, const Context& ctx) {
    if (ctx) {
      stacks.push_back(torch::getCapturedTracebackFromContext(ctx));
      owners.push_back(d);
    } else {
      d["frames"] = py::list();
    }
  };
  py::list segments;
  for (const auto& s : snap.segments) {
    size_t used = s.active ? s.segment.size : 0;
    py::dict block;
    block["address"] = s.segment.addr;
    block["size"] = s.segment.size;
    block["requested_size"] = s.requested;
    block["state"] = s.active ? "active_allocated" : "inactive";
    frames(block, s.block_context);
    py::dict seg;
    seg["device"] = static_cast<int>(s.device);
    seg["address"] = s.segment.addr;
    seg["total_size"] = s.segment.size;
    seg["allocated_size"] = used;
    seg["active_size"] = used;
    seg["requested_size"] = s.requested;
    seg["stream"] = 0;
    seg["segment_type"] = s.small ? "small" : "large";
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    frames(seg, s.segment.context);
    py::list blocks;
    blocks.append(block);
    seg["blocks"] = blocks;
    segments.append(seg);
  }
  const char* actions[] = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"};
  py::list traces;
  for (const auto& trace : snap.traces) {
    py::list entries;
    for (const auto& te : trace) {
      py::dict e;
      e["action"] = actions[te.action];
      e[te.action == TraceEntry::kOom ? "device_free" : "addr"] = te.addr;
      e["size"] = te.size;
      e["stream"] = 0;
      e["time_us"] = te.time_us;
      frames(e, te.context);
      entries.append(e);
    }
    traces.append(entries);
  }
  auto symbolized = torch::py_symbolize(stacks);
  for (size_t i = 0; i < symbolized.size(); ++i) owners[i]["frames"] = symbolized[i];
  py::dict settings;
  settings["expandable_segments"] = false;
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  out["allocator_settings"] = settings;
  out["external_annotations"] = py::list();
  return out;
}

// The ScalarType PyTorch names `name` ("float64"), as c10::getDtypeNames spells it first.
c10::ScalarType scalar_type_named(const std::string& name) {
  for (int t = 0; t < static_cast<int>(c10::ScalarType::NumOptions); ++t) {
    auto type = static_cast<c10::ScalarType>(t);
    if (name == c10::getDtypeNames(type).first) return type;
  }
  TORCH_CHECK(false, "neuron emulator: the policy names an unknown dtype ", name);
}

uint64_t mask_of(const std::vector<std::string>& dtypes) {
  uint64_t mask = 0;
  for (const auto& name : dtypes) mask |= uint64_t(1) << static_cast<int>(scalar_type_named(name));
  return mask;
}

Policy policy_from(const py::dict& d) {
  auto names = [&](const char* key) {
    auto list = d[key].cast<std::vector<std::string>>();
    return std::unordered_set<std::string>(list.begin(), list.end());
  };
  Policy p;
  p.mixed_ok = names("mixed_ok");
  p.int_as_float = names("int_as_float");
  p.always_grad_input = names("always_grad_input");
  p.implicit_rng = names("implicit_rng");
  p.on_device = names("on_device");
  p.undeclared_writes = names("undeclared_writes");
  p.data_dependent = names("data_dependent");
  p.keeps_int64 = names("keeps_int64");
  for (int k : d["off_device_kinds"].cast<std::vector<int>>()) p.off_device_kinds |= uint64_t(1) << k;
  p.host_mask = mask_of(d["host_dtypes"].cast<std::vector<std::string>>());
  for (const auto& [dtypes, reason] :
       d["downcast_reasons"].cast<std::vector<std::pair<std::vector<std::string>, std::string>>>()) {
    uint64_t mask = mask_of(dtypes);
    p.wide_mask |= mask;
    p.downcast_reasons[mask] = reason;
  }
  p.device_mismatch = d["device_mismatch"].cast<std::string>();
  p.unsupported_layout = d["unsupported_layout"].cast<std::string>();
  return p;
}

py::list taken() {
  py::list out;
  for (const auto& c : take_counts()) {
    out.append(py::make_tuple(py::reinterpret_steal<py::object>(c.tally), c.calls, c.host_ns));
  }
  return out;
}

}  // namespace

Classification classify(const std::string& name, const std::vector<std::string>& dtypes) {
  py::gil_scoped_acquire gil;
  try {
    TORCH_CHECK(classify_fn != nullptr, "neuron emulator: the core is not configured");
    py::handle fn(classify_fn);
    auto r = fn(name, py::tuple(py::cast(dtypes)));
    auto t = r.cast<py::tuple>();
    Classification c{kind_index(t[0].cast<std::string>()), t[1].cast<std::string>(), {}};
    for (py::handle rule : t[2]) {  // conditions.ArgRule
      NamedArgTest a{rule.attr("test").cast<std::string>(), rule.attr("arg").cast<std::string>(), "",
                     kind_index(rule.attr("kind").cast<std::string>()), {}, rule.attr("shown").cast<std::string>()};
      if (!rule.attr("of").is_none()) a.of = rule.attr("of").cast<std::string>();
      py::object value = rule.attr("value");
      if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
        a.values = value.cast<std::vector<int64_t>>();
      } else if (py::isinstance<py::bool_>(value)) {
        a.values.push_back(value.cast<bool>() ? 1 : 0);
      } else if (!value.is_none()) {
        a.values.push_back(value.cast<int64_t>());
      }
      c.tests.push_back(std::move(a));
    }
    return c;
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

namespace {

// What a delivery of one (op, kind) needs from Python, kept between calls: a loop that falls back on every
// step makes no new strings and no new shape tuples. Guarded by the GIL; never released.
struct Delivery {
  py::object name, overload, kind, reason, shapes, dtypes;
  std::string reason_text;
  Signature sig;
};

std::unordered_map<uint64_t, Delivery>& deliveries() {
  static auto* d = new std::unordered_map<uint64_t, Delivery>();
  return *d;
}

// A thread of torch's own (autograd's device thread, delivering a backward op's call) has no Python thread state:
// pybind11's acquire would make one and its release delete it again, every delivery. One state kept for the thread's
// life (never released: the interpreter clears it at exit) makes a delivery from it one GIL hand-over.
void keep_thread_state() {
  thread_local bool kept = false;
  if (kept) return;
  kept = true;
  if (PyGILState_GetThisThreadState() != nullptr) return;
  PyGILState_Ensure();  // the state, its count left at 1
  PyEval_SaveThread();  // the GIL goes back; the state stays
}

}  // namespace

void deliver(const void* key, const std::string& name, const std::string& overload, int kind,
             const std::string& reason, c10::function_ref<const Signature&()> signature, int64_t host_ns,
             c10::function_ref<const std::vector<c10::IValue>&()> call_args) {
  keep_thread_state();
  py::gil_scoped_acquire gil;
  if (deliver_fn == nullptr) return;
  try {
    Line line;
    Frames frames;
    const bool lined = line_of(key, kind, &line);
    if (lined && count_at(line, host_ns, &frames)) return;
    const Signature& sig = signature();
    auto& d = deliveries()[reinterpret_cast<uintptr_t>(key) * kMaxKinds + kind];
    if (!d.name) {
      d.name = py::str(name);
      d.overload = py::str(overload);
      d.kind = py::str(kind_names[kind]);
    }
    if (!d.reason || d.reason_text != reason) {
      d.reason = py::str(reason);
      d.reason_text = reason;
    }
    if (!d.shapes || !(d.sig == sig)) {
      auto s = signature_tuple(sig);
      d.shapes = s[0];
      d.dtypes = s[1];
      d.sig = sig;
    }
    const std::vector<c10::IValue>& args = call_args();
    py::tuple pyargs(args.size());
    for (size_t i = 0; i < args.size(); ++i) pyargs[i] = torch::jit::toPyObject(args[i]);
    py::handle fn(deliver_fn);
    py::object taken = fn(d.name, d.overload, d.kind, d.reason, d.shapes, d.dtypes, host_ns, pyargs);
    if (lined && !taken.is_none()) {  // (the line's tally, how many of its next calls it takes for their stacks)
      auto t = taken.cast<py::tuple>();
      keep_tally(line, t[0].ptr(), t[1].cast<int>(), std::move(frames));
    }
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

void abort_check(const std::string& name, const std::string& overload, const std::vector<c10::IValue>& args) {
  py::gil_scoped_acquire gil;
  if (abort_fn == nullptr) return;
  try {
    py::tuple pyargs(args.size());
    for (size_t i = 0; i < args.size(); ++i) pyargs[i] = torch::jit::toPyObject(args[i]);
    py::handle fn(abort_fn);
    fn(name, overload, pyargs);
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

std::vector<std::string> allocation_site() {
  py::gil_scoped_acquire gil;
  if (site_fn == nullptr) return {};
  try {
    py::handle fn(site_fn);
    return fn().cast<std::vector<std::string>>();
  } catch (py::error_already_set& e) {
    rethrow(e);
  }
}

}  // namespace neuron_lab

PYBIND11_MODULE(_core, m) {
  using namespace neuron_lab;
  m.doc() = "The compiled core of neuron_lab's emulated `neuron` device.";

  m.def(
      "configure",
      [](const std::vector<int64_t>& capacities, const std::vector<std::string>& kinds, py::object classify,
         py::object deliver, py::object site, bool emulate_downcast) {
        TORCH_CHECK(kinds.size() >= 2 && kinds.size() <= kMaxKinds && kinds[kNative] == "native" &&
                        kinds[kDowncast] == "downcast",
                    "neuron emulator: configure() takes 2 to ", kMaxKinds, " kinds, native and downcast first");
        kind_names = kinds;
        auto sync = std::find(kinds.begin(), kinds.end(), "sync");
        set_sync_kind(sync == kinds.end() ? -1 : static_cast<int>(sync - kinds.begin()));
        set_callback(classify_fn, classify);
        set_callback(deliver_fn, deliver);
        set_callback(site_fn, site);
        set_emulate_downcast(emulate_downcast);
        configure_devices(capacities);
      },
      "Devices (one capacity each), the kinds of op call by index, and the Python callbacks: classify(name, "
      "dtypes) -> (kind, reason, argument conditions), deliver(...), site().");

  m.def(
      "set_aborts",
      [](const std::vector<std::string>& names, py::object check) {
        set_callback(abort_fn, check);
        set_abort_ops(names);
      },
      "The coverage's abort ops and check(name, overload, args), called before each of their calls runs.");

  m.def("set_policy", [](const py::dict& rules) { set_policy(policy_from(rules)); },
        "The rules both cores share (neuron_lab.backend.emulator.policy.for_core()): op quirk tables, the downcast "
        "reasons by wide dtype set, and message templates; turned into C++ tables once, here.");

  // devices
  m.def("device_count", [] { return static_cast<int>(device_count()); });
  m.def("current_device", [] { return static_cast<int>(current_device()); });
  m.def("set_device", [](int64_t i) { set_device(checked_index(i)); });
  m.def("checked_index", [](int64_t i) { return static_cast<int>(checked_index(i)); });

  // memory
  m.def("memory_stats", [](int64_t i) { return flat_stats(checked_index(i)); });
  m.def("memory_values", [](int64_t i, const py::tuple& keys) { return flat_values(checked_index(i), keys); });
  m.def("capacity", [](int64_t i) { return allocator().capacity(checked_index(i)); });
  m.def("memory_allocated", [](int64_t i) {
    return allocator().getDeviceStats(checked_index(i)).allocated_bytes[0].current;
  });
  m.def("reset_peak", [](int64_t i) { allocator().resetPeakStats(checked_index(i)); });
  m.def("reset_accumulated", [](int64_t i) { allocator().resetAccumulatedStats(checked_index(i)); });
  m.def("empty_cache", [](int64_t i) { allocator().empty_cache(checked_index(i)); });
  m.def("mem_get_info", [](int64_t i) { return allocator().getMemoryInfo(checked_index(i)); });
  m.def("open_window", [](int64_t i) { return allocator().open_window(checked_index(i)); });
  m.def("close_window", [](int64_t w) { return allocator().close_window(w); });
  m.def("total_allocated", [] { return allocator().total_allocated(); });
  m.def("set_record_sites", [](bool on) { allocator().record_sites = on; });
  m.def("record_memory_history",
        [](bool enabled, int context, size_t max_entries, bool clear) {
          allocator().record_history(enabled, context, max_entries, clear);
        },
        "History on or off, with stacks at context 0-3 (none, state, alloc, all), keeping the last max_entries "
        "actions per device; turning it off, or clear, empties the history.");
  m.def("memory_snapshot", [] { return snapshot_dict(allocator().snapshot()); },
        "Segments and history of every device, as torch.cuda.memory._snapshot() spells them.");
  m.def("live_allocations", [] {
    py::list out;
    for (const auto& b : allocator().live_blocks()) {
      py::object dtype = b.dtype == c10::ScalarType::Undefined ? py::object(py::none())
                                                                : py::str(std::string(c10::getDtypeNames(b.dtype).first));
      py::object shape = b.dtype == c10::ScalarType::Undefined ? py::object(py::none()) : py::tuple(py::cast(b.shape));
      py::object site = b.site.empty() ? py::object(py::none()) : py::tuple(py::cast(b.site));
      out.append(py::make_tuple(reinterpret_cast<uintptr_t>(b.ptr), b.nbytes, dtype, shape, b.created_ns, site,
                                static_cast<int>(b.device)));
    }
    return out;
  });

  // ops
  m.def("op_rows", [] {
    py::list out;
    for (const auto& r : op_rows()) {
      py::list sigs;
      for (const auto& s : r.signatures) sigs.append(signature_tuple(s));
      out.append(py::make_tuple(r.name, r.overload, kind_names[r.kind], r.reason, r.count, r.host_ns, sigs));
    }
    return out;
  });
  m.def("register_direct", &register_direct);
  m.def("typed_ops", &typed_names, "The overloads with a typed kernel; the other direct ones take the boxed fallback.");
  m.def("clear_ops", &clear_op_rows);
  m.def("forget_kinds", &forget_kinds);
  m.def("set_wanted", &set_wanted);
  m.def("set_lines",
        [](int kinds_mask, py::object roles, unsigned long main_thread) {
          py::list counts = taken();
          set_lines(kinds_mask, roles.is_none() ? nullptr : roles.ptr(), main_thread);
          return counts;
        },
        "Count calls of these kinds (a bit per kind) by line, roles(code) naming each code object's role (None: "
        "none), the main thread's ident naming the thread whose line a thread with no user frame takes; returns the "
        "counts kept so far, as take_lines() does.");
  m.def("take_lines", &taken,
        "The calls counted by line since the last take, as (tally, calls, host_ns), the tally being what the "
        "subscriber returned for the line's call.");
  m.def("op_calls", &op_calls);

  // torch.profiler
  m.def("set_trace_kinds", &set_trace_kinds,
        "Kind names by index, and for kinds that run on the host the label their calls get in traces, else ''.");
  m.def("profiler_registered", &profiler_registered,
        "Whether the core serves both of PyTorch's PrivateUse1 profiler hooks (Kineto and the legacy stubs).");
  m.def("tracing", &tracing, "Whether a Kineto session records the device now.");
  m.def("profile_clock", &profile_clock, "Unix epoch ns, the clock of Kineto's CPU ops.");
  m.def("trace_collective", [](const std::string& name, int64_t device, int64_t bytes, int64_t start_ns,
                               int64_t end_ns) { trace_collective(name, checked_index(device), bytes, start_ns, end_ns); },
        "A collective from call to completion, a kernel on the device's lane while a Kineto session records.");
  m.def("transfers", &transfers);

  m.def("to_host", &host_alias, "The CPU alias of a device tensor's bytes (no copy).");
  m.def("from_host", [](const at::Tensor& r, int64_t device) { return from_host(r, checked_index(device)); },
        "A device tensor over a host tensor's bytes (no copy); views of device memory keep their storage.");

  // random numbers
  m.def("default_generator", [](int64_t i) { return default_generator(checked_index(i)); });
  m.def("now_ns", [] { return now_ns(); }, "The core's steady clock (runtime/clock.h), in ns.");
}
