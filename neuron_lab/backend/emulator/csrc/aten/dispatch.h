// The boxed PrivateUse1 fallback of the emulated device and its per-op aggregates (dispatch.cpp says how),
// with what the backend's own kernels (kernels.cpp) share with it.
#pragma once

#include "aten/policy.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/FunctionRef.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace neuron_lab {

using Stack = std::vector<c10::IValue>;

// Kinds of op call are named by Python (neuron_lab.kinds) at configure time; the core itself makes only the
// first two, and numbers the others in the order it was given.
enum Kind : int { kNative = 0, kDowncast = 1, kMaxKinds = 16 };

struct Signature {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> dtypes;
  bool operator==(const Signature& o) const { return shapes == o.shapes && dtypes == o.dtypes; }
};

// count and host_ns are atomic: an op is counted without a lock. Its first calls (the signature probes) compare
// their signature's fingerprint with the kept ones' (`prints`, the first `printed` of them), also without a lock:
// only a signature not kept yet takes it.
struct OpStat {
  static constexpr size_t kMaxSignatures = 4;
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> host_ns{0};
  std::string reason;
  std::vector<Signature> signatures;
  std::array<std::atomic<uint64_t>, kMaxSignatures> prints{};
  std::atomic<size_t> printed{0};
};

struct OpRow {  // one (op, kind) aggregate, as Python reads it
  std::string name, overload, reason;
  int kind;
  int64_t count, host_ns;
  std::vector<Signature> signatures;
};

// Route these overloads to the fallback directly: one call instead of a composite's empty + `.out` pair, or
// instead of a composite that differs from the CPU kernel.
void register_direct(const std::vector<std::string>& names);

std::vector<OpRow> op_rows();
void clear_op_rows();
void forget_kinds();  // the coverage profile changed
void set_wanted(int kinds_mask);
void set_emulate_downcast(bool on);
int64_t op_calls();
std::vector<int64_t> transfers();  // h2d, d2h since the last clear; then the same since the start

// An argument condition (neuron_lab/backend/coverage/conditions.py names the same tests): a call meeting it takes
// `kind` instead of the op's. Arguments by their index in the op's schema; -1: the op has no argument of that name.
enum ArgTestKind : int { kNdimNotIn, kNotLastDim, kBelow, kIs, kEmpty };
struct ArgTest {
  int test, arg, of = -1, kind;
  std::vector<int64_t> values;  // ndim_not_in: the accepted ranks; below: the bound; is: 0 or 1
  std::string reason;
};
// An argument condition as the coverage names it, before a plan's schema resolves its names.
struct NamedArgTest {
  std::string test, arg, of;
  int kind;
  std::vector<int64_t> values;
  std::string reason;
};

// How one op call with a given set of device dtypes is reported; `tests` are tried on each call, first met wins.
struct Classified {
  uint64_t mask;
  int kind;
  std::string reason;
  std::vector<ArgTest> tests;
};

// What the schema says about one overload, and its aggregates per kind; made once per operator.
struct Plan {
  const c10::FunctionSchema* schema = nullptr;
  std::string name, overload;
  std::vector<int> write_returns;  // per return: the argument it aliases when written, or -1
  std::vector<int> write_args;
  std::vector<int> undeclared_writes;  // written too, not in the schema: copied back from a 64-bit-rule stand-in
  int generator_arg = -1;
  int dtype_arg = -1;
  bool is_view = false, mixed_ok = false, implicit_rng = false, on_device = false, int_as_float = false;
  bool always_grad_input = false;
  bool keeps_int64 = false;  // its TorchNeuron kernel keeps int64 under the 64-bit rule (a copy, clone, plumbing)
  // An in-place op (`add_`, `_foreach_mul_`; not the resize family): its written arguments keep their bytes, so a
  // kernel computes on their blocks' own host storages, as on a read argument's, instead of on a growable alias.
  bool in_place = false;
  bool data_dependent = false;  // a device-to-host read: reported as a sync when somebody wants them
  // An op of the coverage's aborts (set_abort_ops): each call is handed to Python's check before it runs.
  std::atomic<bool> aborts{false};
  // device dtype set -> kind, reason. Entries are never freed (forget_kinds only unlinks them), so the last one
  // an op saw is read without a lock.
  std::unordered_map<uint64_t, const Classified*> kinds;
  std::atomic<const Classified*> last_kind{nullptr};
  OpStat stats[kMaxKinds];
};

Plan& plan_of(const c10::OperatorHandle& op);
Plan& named(const char* name, const char* overload);
// One call of kind `kind`: counted, its signature probed, delivered to Python if somebody wants that kind.
void record(Plan& p, int kind, const std::string& reason, int64_t host_ns, const Stack& args);
// The same for a kernel that has its tensors at hand: the argument stack is made only for a delivery to Python.
void record(Plan& p, int kind, const std::string& reason, int64_t host_ns, c10::ArrayRef<const at::Tensor*> tensors,
            c10::function_ref<Stack()> args);
// The fallback itself: run `op` on host aliases of its device arguments, report it, present its results.
void run(const c10::OperatorHandle& op, Stack* stack);
// A typed kernel's call (unboxed.cpp). On the plain path (every tensor on one device or a CPU scalar, no 64-bit
// dtype, no profiler, no quirk of the op in the policy) `kernel` computes on host aliases, and its result is
// presented and counted as run() would; any other call is run() itself, over the stack `args` makes.
at::Tensor direct(const c10::OperatorHandle& op, Plan& p, c10::ArrayRef<const at::Tensor*> tensors,
                  c10::function_ref<at::Tensor()> kernel, c10::function_ref<Stack()> args);
// The same for an in-place op: `kernel` writes `self`'s host alias (self is on the device), and self is the result.
at::Tensor& direct_(const c10::OperatorHandle& op, Plan& p, at::Tensor& self, c10::ArrayRef<const at::Tensor*> tensors,
                    c10::function_ref<void()> kernel, c10::function_ref<Stack()> args);
// The same for a kernel of several results (a tuple): `kernel` puts them, computed on host aliases, in
// `results`, each then presented as direct()'s one (an undefined one stays undefined). False: the call is off the
// plain path, and the caller runs it through run() itself. `draws_on_device`: the kernel draws its random numbers
// from the device's generator itself (an op of the policy's implicit_rng stays on the plain path).
bool direct_results(Plan& p, c10::ArrayRef<const at::Tensor*> tensors,
                    c10::function_ref<void(std::vector<at::Tensor>&)> kernel, c10::function_ref<Stack()> args,
                    std::vector<at::Tensor>& results, bool draws_on_device = false);
// native_dropout on `in`'s host alias as the CPU kernel computes it, drawing from `device`'s generator's engine instead
// of the default CPU generator: the same stream a CPU generator seeded alike gives, without touching the CPU's.
std::tuple<at::Tensor, at::Tensor> dropout_on_host(c10::DeviceIndex device, const at::Tensor& in, double p,
                                                   std::optional<bool> train);
void count_transfer(int64_t to_device, int64_t to_host);
// A device-to-host read of `p`'s call (item, a copy to the CPU, a data-dependent shape): delivered to Python as a
// call of kind `sync` only while somebody wants that kind; nothing else is kept.
void sync_point(Plan& p, const Stack& args);
void set_sync_kind(int kind);  // its index among the kinds; -1: none
// The rules both cores share, from Python at configure; plans made before take them too.
void set_policy(Policy policy);
// The coverage's abort ops (neuron_lab.backend.emulator.aborts): only their calls pay for abort_check.
void set_abort_ops(const std::vector<std::string>& names);

// Hides a host kernel's own ATen calls from RecordFunction observers (profilers): they are how the emulator
// computes, not ops of the device. Only while one listens: switching RecordFunction off rebuilds its thread-local
// callback list, which an unobserved op should not pay for.
struct QuietHost {
  std::optional<at::DisableRecordFunctionGuard> guard;
  QuietHost() {
    if (at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION)) guard.emplace();
  }
};

// -- Python, called from C++ (module.cpp): each takes the GIL and turns a Python exception into a
// C++ exception that PyTorch re-raises unchanged in Python (KeyboardInterrupt included).
struct Classification {
  int kind;
  std::string reason;
  std::vector<NamedArgTest> tests;
};
Classification classify(const std::string& name, const std::vector<std::string>& dtypes);
// A call of an abort op, before it runs: Python flags it (a row, a warning) or raises when a parameter is among `args`.
void abort_check(const std::string& name, const std::string& overload, const std::vector<c10::IValue>& args);
// `key` names the op (its plan): the Python strings and the last signature's tuples are made once per key. A call
// at a line its subscriber is done with is only counted there (lines.h): no signature, no arguments, no Python call.
void deliver(const void* key, const std::string& name, const std::string& overload, int kind,
             const std::string& reason, c10::function_ref<const Signature&()> sig, int64_t host_ns,
             c10::function_ref<const std::vector<c10::IValue>&()> args);

}  // namespace neuron_lab
