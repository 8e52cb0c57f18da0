// How the emulated device runs ATen ops: one boxed PrivateUse1 fallback over zero-copy CPU aliases.
//
// The coverage profile decides only how a call is reported (native, CPU fallback, host kernel); counts
// are aggregated here, and Python hears of a call only when its kind is one somebody subscribed to (and from a
// subscriber that takes calls by line, only a line's first calls: lines.h).
#include "aten/dispatch.h"

#include "aten/host_alias.h"
#include "aten/unboxed.h"
#include "profiler/profiler.h"
#include "runtime/allocator.h"
#include "runtime/clock.h"
#include "runtime/device.h"
#include "runtime/generator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace neuron_lab {
namespace {

constexpr int64_t kSignatureProbes = 256;  // calls per op inspected for a new signature
constexpr size_t kMaxSignatures = OpStat::kMaxSignatures;

std::mutex plans_mu;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<Plan>> plans;
std::atomic<int> wanted{0};
std::atomic<bool> emulate_downcast{false};
Policy rules;  // set once at configure, before any op runs; read without a lock
std::unordered_set<std::string> abort_names;  // the coverage's abort ops; guarded by plans_mu
std::atomic<int64_t> calls{0}, h2d{0}, d2h{0}, h2d_total{0}, d2h_total{0};

// The policy's quirks for one op, looked up once per plan (and again if the policy is set anew).
void apply_rules(Plan& p) {
  p.mixed_ok = rules.mixed_ok.count(p.name) > 0;
  p.implicit_rng = rules.implicit_rng.count(p.name) > 0;
  p.int_as_float = rules.int_as_float.count(p.name) > 0;
  p.always_grad_input = rules.always_grad_input.count(p.name) > 0;
  p.data_dependent = rules.data_dependent.count(p.name) > 0;
  p.keeps_int64 = rules.keeps_int64.count(p.name) > 0;
  p.aborts.store(abort_names.count(p.name) > 0, std::memory_order_relaxed);
  // set_() has a kernel of its own (set_empty); its other overloads bind a storage on the device tensor itself.
  p.on_device = rules.on_device.count(p.name) > 0 && !(p.name == "aten::set_" && p.overload.empty());
}

std::string dtype_name(c10::ScalarType t) {
  return std::string(c10::getDtypeNames(t).first);
}

// Calls f on each tensor an argument holds: itself, or the members of a (optional-)tensor list.
template <typename F>
void for_each_tensor(const c10::IValue& v, F f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isOptionalTensorList()) {
    for (const auto& t : v.toOptionalTensorList()) {
      std::optional<at::Tensor> ot = t;
      if (ot) f(*ot);
    }
  }
}

void add_to(Signature& s, const at::Tensor& t) {
  // A wrapped Python number (the 3 of `x * 3`) is no tensor of the user's: the Python core sees a number there.
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
  s.shapes.push_back(t.sizes().vec());
  s.dtypes.push_back(dtype_name(t.scalar_type()));
}

Signature signature_of(const Stack& args) {
  Signature s;
  for (const auto& v : args) for_each_tensor(v, [&](const at::Tensor& t) { add_to(s, t); });
  return s;
}

// A typed kernel's signature, from its tensors alone: no argument stack (whose copies of Python-owned tensors each
// take the GIL to count a reference).
Signature signature_of(c10::ArrayRef<const at::Tensor*> tensors) {
  Signature s;
  for (const at::Tensor* t : tensors) add_to(s, *t);
  return s;
}

int arg_index(const Plan& p, const std::string& name) {
  if (name.empty()) return -1;
  auto i = p.schema->argumentIndexWithName(name);
  return i ? static_cast<int>(*i) : -1;
}

ArgTest resolved(const Plan& p, NamedArgTest&& t) {
  static const std::unordered_map<std::string, int> tests{
      {"ndim_not_in", kNdimNotIn}, {"not_last_dim", kNotLastDim}, {"below", kBelow}, {"is", kIs}, {"empty", kEmpty}};
  auto it = tests.find(t.test);
  TORCH_CHECK(it != tests.end(), "neuron emulator: unknown argument test '", t.test, "'");
  return ArgTest{it->second, arg_index(p, t.arg), arg_index(p, t.of), t.kind, std::move(t.values),
                 std::move(t.reason)};
}

// Whether one call meets `t` (conditions.met, the same rules): an argument that is not what the test reads never does.
bool meets(const ArgTest& t, const Stack& args) {
  if (t.arg < 0) return false;
  const c10::IValue& v = args[t.arg];
  switch (t.test) {
    case kNdimNotIn:
      return v.isTensor() && std::find(t.values.begin(), t.values.end(), v.toTensor().dim()) == t.values.end();
    case kEmpty:
      return v.isTensor() && v.toTensor().numel() == 0;
    case kIs:
      return v.isBool() && v.toBool() == (t.values.at(0) != 0);
    case kBelow:
      return v.isInt() && v.toInt() < t.values.at(0);
    case kNotLastDim: {
      if (!v.isInt() || t.of < 0 || !args[t.of].isTensor()) return false;
      const int64_t ndim = std::max<int64_t>(args[t.of].toTensor().dim(), 1), d = v.toInt();
      return (d < 0 ? d + ndim : d) != ndim - 1;
    }
  }
  return false;
}

// The kind and reason of one call: its op's, or the first argument condition's it meets.
std::pair<int, const std::string*> kind_of_call(const Classified& k, const Stack& args) {
  for (const ArgTest& t : k.tests) {
    if (meets(t, args)) return {t.kind, &t.reason};
  }
  return {k.kind, &k.reason};
}

// kind_of's other calls: an op's first call with a set of dtypes, or after another set. Out of line, so that the
// common call's frame is small.
[[gnu::noinline]] const Classified& classified(Plan& p, uint64_t mask) {
  {
    std::lock_guard<std::mutex> g(plans_mu);
    auto it = p.kinds.find(mask);
    if (it != p.kinds.end()) {
      p.last_kind.store(it->second, std::memory_order_release);
      return *it->second;
    }
  }
  std::vector<std::string> names;
  for (int t = 0; t < 64; ++t) {
    if ((mask >> t) & 1) names.push_back(dtype_name(static_cast<c10::ScalarType>(t)));
  }
  Classification c = classify(p.name, names);
  auto* k = new Classified{mask, c.kind, std::move(c.reason), {}};  // never freed: see Plan::kinds
  for (auto& t : c.tests) k->tests.push_back(resolved(p, std::move(t)));
  std::lock_guard<std::mutex> g(plans_mu);
  p.kinds[mask] = k;
  p.last_kind.store(k, std::memory_order_release);
  return *k;
}

const Classified& kind_of(Plan& p, uint64_t mask) {
  const Classified* last = p.last_kind.load(std::memory_order_acquire);
  if (last && last->mask == mask) [[likely]] return *last;
  return classified(p, mask);
}

std::string where(c10::DeviceIndex d) {
  return "neuron:" + std::to_string(static_cast<int>(d));
}

// One fallback call: its device, the aliases it made, the dtypes it saw.
struct Call {
  const Plan& plan;
  c10::DeviceIndex device = -1;
  uint64_t mask = 0;
  // Inline capacity for the usual op (a few tensors): no heap allocation for the bookkeeping itself.
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 4> aliases;  // CPU alias -> device storage
  // CPU result -> device storage. The CPU storage is held: a result dropped once adopted (the 64-bit rule's float64
  // copy of a float32 result) must not free an address the next result's storage could take and be mistaken for.
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 2> adopted;
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 1> growable;  // out= aliases that may grow
  c10::SmallVector<const c10::StorageImpl*, 2> cpu_inputs;

  explicit Call(const Plan& p) : plan(p) {}

  void find_device(const c10::IValue& v) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (device < 0 && t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) device = t.device().index();
    });
  }

  at::Tensor to_host(const at::Tensor& t, bool written = false) {
    if (!t.defined()) return t;
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      TORCH_CHECK(t.device().index() == device,
                  fill(rules.device_mismatch, {{"first", where(device)}, {"second", where(t.device().index())},
                                               {"op", plan.name}}));
      mask |= uint64_t(1) << static_cast<int>(t.scalar_type());
      if (written && !plan.in_place) {
        auto alias = cpu_alias_storage(t.storage(), true);
        growable.emplace_back(alias, t.storage());
        aliases.emplace_back(alias, t.storage());
        return over(std::move(alias), kCPU, t);
      }
      const auto* impl = t.storage().unsafeGetStorageImpl();
      for (const auto& [cpu, dev] : aliases) {
        if (dev.unsafeGetStorageImpl() == impl) return over(cpu, kCPU, t);
      }
      auto alias = cpu_alias_storage(t.storage());
      aliases.emplace_back(alias, t.storage());
      return over(std::move(alias), kCPU, t);
    }
    if (t.is_cpu()) {
      TORCH_CHECK(!written && (t.dim() == 0 || plan.mixed_ok),
                  fill(rules.device_mismatch, {{"first", where(device)}, {"second", "cpu"}, {"op", plan.name}}));
      cpu_inputs.push_back(t.storage().unsafeGetStorageImpl());
    }
    return t;
  }

  c10::IValue convert(const c10::IValue& v, bool written = false) {
    if (v.isTensor()) return to_host(v.toTensor(), written);
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto in = v.toTensorList();
      out.reserve(in.size());
      for (const auto& t : in) out.push_back(to_host(t, written));
      return out;
    }
    if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& t : v.toOptionalTensorList()) {
        std::optional<at::Tensor> ot = t;
        out.push_back(ot ? std::optional<at::Tensor>(to_host(*ot)) : std::nullopt);
      }
      return out;
    }
    if (v.isGenerator()) {
      const auto& gen = v.toGenerator();
      if (gen.device().type() == c10::DeviceType::PrivateUse1) return cpu_engine(gen);
      return v;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      if (device < 0) device = v.toDevice().has_index() ? checked_index(v.toDevice().index()) : current_device();
      return c10::Device(c10::DeviceType::CPU);
    }
    return v;
  }

  // A CPU result presented as a device tensor: a view of an input's bytes keeps that input's storage.
  at::Tensor back(const at::Tensor& r) {
    if (!r.defined() || r.device().type() == c10::DeviceType::PrivateUse1) return r;
    TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::kStrided, fill(rules.unsupported_layout, {{"layout", c10::str(r.layout())}}));
    const auto* impl = r.storage().unsafeGetStorageImpl();
    for (const auto& [cpu, dev] : aliases) {
      if (cpu.unsafeGetStorageImpl() == impl) return on_device(dev, r);
    }
    for (const auto& [cpu, dev] : adopted) {
      if (cpu.unsafeGetStorageImpl() == impl) return on_device(dev, r);
    }
    at::Tensor own = r;
    if (std::find(cpu_inputs.begin(), cpu_inputs.end(), impl) != cpu_inputs.end()) own = r.clone();
    auto storage = adopt(own, device < 0 ? current_device() : device);
    adopted.emplace_back(own.storage(), storage);
    return on_device(storage, own);
  }

  // Device storages whose out= alias a kernel grew: grow them in place and take the bytes.
  void settle_growth() {
    for (auto& [cpu, dev] : growable) {
      if (cpu.data() == dev.data()) continue;
      allocator().resize(dev, cpu.nbytes());
      if (cpu.nbytes()) std::memcpy(dev.mutable_data(), cpu.data(), cpu.nbytes());
    }
  }

  c10::IValue back(const c10::IValue& v) {
    if (v.isTensor()) return back(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const auto& t : v.toTensorList()) out.push_back(back(t));
      return out;
    }
    return v;
  }
};

// Give written device tensors the layout a CPU kernel gave their aliases (an out= resized in place).
// A float32 stand-in for a float64 out= (the 64-bit rule) is not an alias: downcast's copy-back settles that one.
void sync_layout(const at::Tensor& dev, const at::Tensor& h) {
  if (!dev.defined() || !h.defined() || dev.device().type() != c10::DeviceType::PrivateUse1) return;
  if (dev.scalar_type() != h.scalar_type()) return;
  if (dev.sizes() != h.sizes() || dev.strides() != h.strides() || dev.storage_offset() != h.storage_offset()) {
    dev.unsafeGetTensorImpl()->set_sizes_and_strides(h.sizes(), h.strides(), h.storage_offset());
  }
}

void sync_layouts(const Plan& p, const Stack& orig, const Stack& hargs) {
  for (int i : p.write_args) {
    if (orig[i].isTensor()) {
      sync_layout(orig[i].toTensor(), hargs[i].toTensor());
    } else if (orig[i].isTensorList()) {
      auto d = orig[i].toTensorList();
      auto h = hargs[i].toTensorList();
      for (size_t j = 0; j < d.size(); ++j) sync_layout(d[j], h[j]);
    }
  }
}

// An out= that must grow: compute into host temporaries, resize the device outputs, copy.
void run_resizing(const c10::OperatorHandle& op, const Plan& p, const Stack& orig, Stack hargs, Stack* stack) {
  std::vector<std::pair<at::Tensor, at::Tensor>> temps;
  for (int i : p.write_args) {
    if (orig[i].isTensor() && orig[i].toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      auto tmp = at::empty({0}, orig[i].toTensor().options().device(c10::kCPU));
      temps.emplace_back(orig[i].toTensor(), tmp);
      hargs[i] = tmp;
    } else if (orig[i].isTensorList()) {
      c10::List<at::Tensor> tl;
      for (const at::Tensor& d : orig[i].toTensorList()) {
        auto tmp = at::empty({0}, d.options().device(c10::kCPU));
        temps.emplace_back(d, tmp);
        tl.push_back(tmp);
      }
      hargs[i] = tl;
    }
  }
  for (auto& v : hargs) stack->push_back(std::move(v));
  op.redispatchBoxed(kCPU, stack);
  for (auto& [dev, tmp] : temps) {
    dev.resize_(tmp.sizes());
    host(dev).copy_(tmp);
  }
}

// A written float64 argument computed in float32: the device tensor, and the float32 stand-in the kernel wrote.
struct Lowered {
  at::Tensor dev;
  at::Tensor low;
};

// A result the 64-bit rule computed narrow, in the dtype the caller asked for: float32 as float64, complex64 as
// complex128 (an FFT of float64), the tensors of a list too (histogramdd's bin edges).
c10::IValue widened(const c10::IValue& v) {
  auto wide = [](const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.scalar_type() == at::kFloat) return t.to(at::kDouble);
    return t.scalar_type() == at::kComplexFloat ? t.to(at::kComplexDouble) : t;
  };
  if (v.isTensor()) return wide(v.toTensor());
  if (!v.isTensorList()) return v;
  c10::List<at::Tensor> out;
  for (const at::Tensor& t : v.toTensorList()) out.push_back(wide(t));
  return out;
}

// float64 in, float32 compute, float64 out: TorchNeuron's silent downcast made visible.
bool downcast(const Plan& p, const Stack& orig, Stack& hargs, std::vector<Lowered>& written) {
  if (!emulate_downcast.load() || p.is_view) return false;
  // TorchNeuron casts float64 tensors with dimensions (base.py, _cast_tensor_if_float64): a call whose float64 tensors
  // are all 0-dim computes exactly; beside a cast one, a 0-dim one is cast too, as a float32 kernel reads it.
  bool dims64 = false;
  for (const auto& v : hargs) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      dims64 |= t.defined() && t.scalar_type() == at::kDouble && t.dim() != 0;
    });
  }
  if (!dims64) return false;
  auto low = [](const at::Tensor& t) { return t.defined() && t.scalar_type() == at::kDouble ? t.to(at::kFloat) : t; };
  for (size_t i = 0; i < hargs.size(); ++i) {
    bool writes = std::find(p.write_args.begin(), p.write_args.end(), static_cast<int>(i)) != p.write_args.end() ||
                  std::find(p.undeclared_writes.begin(), p.undeclared_writes.end(), static_cast<int>(i)) !=
                      p.undeclared_writes.end();
    auto& v = hargs[i];
    if (v.isTensor()) {
      auto t = v.toTensor();
      auto l = low(t);
      if (writes && !l.is_same(t)) written.push_back({orig[i].toTensor(), l});
      v = l;
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      auto devs = orig[i].toTensorList();
      for (size_t j = 0; j < devs.size(); ++j) {
        at::Tensor t = v.toTensorList().get(j);
        auto l = low(t);
        if (writes && !l.is_same(t)) written.push_back({devs.get(j), l});
        out.push_back(l);
      }
      v = out;
    }
  }
  if (p.dtype_arg >= 0 && hargs[p.dtype_arg].isInt() &&
      hargs[p.dtype_arg].toInt() == static_cast<int64_t>(at::kDouble)) {
    hargs[p.dtype_arg] = static_cast<int64_t>(at::kFloat);
  }
  return true;
}

void dropout_on_device(c10::DeviceIndex device, const Stack& hargs, Stack* stack) {
  auto [out, mask] = dropout_on_host(device, hargs[0].toTensor(), hargs[1].toDouble(),
                                     hargs[2].isNone() ? std::nullopt : std::optional<bool>(hargs[2].toBool()));
  stack->push_back(out);
  stack->push_back(mask);
}

// TorchNeuron's 64-bit rule for int64 (int64_rule.py says why): a device kernel takes its int64 inputs as int32 and
// gives int32 results back as int64. Computed in int64 on wrapped inputs, results wrapped; values that fit in int32
// cost one pass that finds nothing to do.
bool fits_int32(const at::Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0 || t.layout() != c10::kStrided) return true;  // a sparse result is refused as the device's anyway
  if (t.is_contiguous()) {
    // Biased by 2**31, a value fits when its high 32 bits are zero. Four lanes, so -O2 vectorizes the loop.
    const auto* d = reinterpret_cast<const uint64_t*>(t.const_data_ptr<int64_t>());
    constexpr uint64_t kBias = 0x80000000ull;
    uint64_t over[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int k = 0; k < 4; ++k) over[k] |= d[i + k] + kBias;
    }
    for (; i < n; ++i) over[0] |= d[i] + kBias;
    return ((over[0] | over[1] | over[2] | over[3]) >> 32) == 0;
  }
  auto [lo, hi] = at::aminmax(t);
  return lo.item<int64_t>() >= INT32_MIN && hi.item<int64_t>() <= INT32_MAX;
}

at::Tensor wrapped(const at::Tensor& t) {
  return t.to(at::kInt).to(at::kLong);
}

// An int64 argument as the kernel takes it: a non-0-dim tensor, or a list's (any), wrapped; a written one in place.
// `cast`: there was one the rule casts.
at::Tensor int32_input(const at::Tensor& t, bool written, bool in_list, bool& cast) {
  if (!t.defined() || t.scalar_type() != at::kLong || (t.dim() == 0 && !in_list)) return t;
  cast = true;
  if (fits_int32(t)) return t;
  if (written) return t.copy_(t.to(at::kInt));
  return wrapped(t);
}

// Whether the call had an int64 argument the rule casts (0-dim int64 tensors alone are not: results stay exact).
bool wrap_int64_inputs(const Plan& p, Stack& hargs) {
  bool cast = false;
  for (size_t i = 0; i < hargs.size(); ++i) {
    bool writes = std::find(p.write_args.begin(), p.write_args.end(), static_cast<int>(i)) != p.write_args.end();
    auto& v = hargs[i];
    if (v.isTensor()) {
      v = int32_input(v.toTensor(), writes, false, cast);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(int32_input(t, writes, true, cast));
      v = out;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& t : v.toOptionalTensorList()) {
        std::optional<at::Tensor> ot = t;
        out.push_back(ot ? std::optional<at::Tensor>(int32_input(*ot, writes, true, cast)) : std::nullopt);
      }
      v = out;
    }
  }
  return cast;
}

// The device tensors a call wrote, wrapped in place where a value went past int32.
void wrap_int64_written(const Plan& p, const Stack& orig) {
  auto wrap = [](const at::Tensor& dev) {
    if (!dev.defined() || dev.device().type() != c10::DeviceType::PrivateUse1 || dev.scalar_type() != at::kLong) return;
    at::Tensor h = host(dev);
    if (!fits_int32(h)) h.copy_(h.to(at::kInt));
  };
  for (int i : p.write_args) {
    if (orig[i].isTensor()) {
      wrap(orig[i].toTensor());
    } else if (orig[i].isTensorList()) {
      for (const at::Tensor& t : orig[i].toTensorList()) wrap(t);
    }
  }
}

// A new result restored to int64 from the int32 TorchNeuron computes.
c10::IValue int32_result(const c10::IValue& v) {
  auto wrap = [](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kLong && !fits_int32(t) ? wrapped(t) : t;
  };
  if (v.isTensor()) return wrap(v.toTensor());
  if (!v.isTensorList()) return v;
  c10::List<at::Tensor> out;
  for (const at::Tensor& t : v.toTensorList()) out.push_back(wrap(t));
  return out;
}

const std::string& downcast_reason(uint64_t mask) {
  return rules.downcast_reasons.at(mask & rules.wide_mask);
}

// native_dropout_cpu's `in.mul(mask).mul_(scale)`, element by element where `in` is contiguous float or double: the
// bool mask promoted to in's dtype and the same two products in the same order, so NaN, inf and -0 come out alike,
// without TensorIterator's casting loop over the mask (most of a dropout's own cost).
template <typename T>
__attribute__((optimize("O3"))) void mask_and_scale(const T* __restrict x, const uint8_t* __restrict m, T s,
                                                    int64_t n, T* __restrict o) {  // -O3 here: the core builds at -O2
  for (int64_t i = 0; i < n; ++i) o[i] = (x[i] * static_cast<T>(m[i])) * s;  // a bool's byte is 0 or 1
}

at::Tensor masked_scaled(const at::Tensor& in, const at::Tensor& mask, double scale) {
  const bool plain = in.scalar_type() == at::kFloat || in.scalar_type() == at::kDouble;
  if (!plain || !in.is_contiguous() || !mask.is_contiguous()) {
    return in.mul(mask).mul_(scale);
  }
  at::Tensor out = at::empty(in.sizes(), in.options());
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "masked_scaled", [&] {
    mask_and_scale(in.const_data_ptr<scalar_t>(), reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>()), static_cast<scalar_t>(scale),
                   in.numel(), out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> dropout_on_host(c10::DeviceIndex device, const at::Tensor& in, double p,
                                                   std::optional<bool> train) {
  at::Tensor out, mask;
  if (in.numel() == 0) {
    out = in;
    mask = at::empty_like(in, in.options());
  } else if (train.value_or(true)) {
    double p1m = 1. - p;
    double scale = p1m == 0 ? 0. : 1. / p1m;
    mask = at::empty_like(in, in.options().dtype(at::kBool));
    mask.bernoulli_(p1m, cpu_engine(default_generator(device)));
    out = masked_scaled(in, mask, scale);
  } else {
    mask = at::ones_like(in, in.options().dtype(at::kBool));
    out = in.clone();
  }
  return {out, mask};
}

Plan& plan_of(const c10::OperatorHandle& op) {
  const auto* key = &op.schema();
  // Plans are never freed: each thread keeps the ones it has seen, found without the lock.
  thread_local std::unordered_map<const c10::FunctionSchema*, Plan*> seen;
  auto hit = seen.find(key);
  if (hit != seen.end()) return *hit->second;
  std::lock_guard<std::mutex> g(plans_mu);
  auto it = plans.find(key);
  if (it != plans.end()) return *(seen[key] = it->second.get());
  auto p = std::make_unique<Plan>();
  const auto& schema = op.schema();
  p->schema = &schema;
  p->name = schema.name();
  p->overload = schema.overload_name();
  p->in_place = p->name.back() == '_' && p->name.find("resize") == std::string::npos;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = args[i].alias_info();
    if (a && a->isWrite()) p->write_args.push_back(static_cast<int>(i));
    if (rules.undeclared_writes.count(p->name + "." + args[i].name())) p->undeclared_writes.push_back(static_cast<int>(i));
    auto type = args[i].type();
    if (type->kind() == c10::TypeKind::OptionalType &&
        type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType) {
      p->generator_arg = static_cast<int>(i);
    }
    if (args[i].name() == "dtype") p->dtype_arg = static_cast<int>(i);
  }
  for (const auto& r : schema.returns()) {
    int target = -1;
    if (const auto* a = r.alias_info()) {
      if (a->isWrite()) {
        for (size_t i = 0; i < args.size(); ++i) {
          const auto* ai = args[i].alias_info();
          if (!ai || !ai->isWrite()) continue;
          for (const auto& s : a->beforeSets()) {
            if (ai->beforeSets().count(s)) target = static_cast<int>(i);
          }
          if (target >= 0) break;
        }
      } else {
        p->is_view = true;
      }
    }
    p->write_returns.push_back(target);
  }
  apply_rules(*p);
  return *(seen[key] = plans.emplace(key, std::move(p)).first->second.get());
}

namespace {

enum Wants : int { kProbe = 1, kDeliver = 2 };

// Counts one call; says whether its arguments are wanted: a signature probe, a delivery to Python. Only an op's
// first call in a window takes the lock, for its reason (a clear in between at worst counts one call in the new
// window or the old).
int count(Plan& p, int kind, const std::string& reason, int64_t host_ns) {
  OpStat& st = p.stats[kind];
  int64_t n;
  if (st.count.load(std::memory_order_relaxed) == 0) {
    std::lock_guard<std::mutex> g(plans_mu);
    if (st.count.load(std::memory_order_relaxed) == 0) st.reason = reason;
    n = st.count.fetch_add(1, std::memory_order_relaxed) + 1;
  } else {
    n = st.count.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  st.host_ns.fetch_add(host_ns, std::memory_order_relaxed);
  const bool probe = n <= kSignatureProbes && st.printed.load(std::memory_order_acquire) < kMaxSignatures;
  if (kind != kDowncast) calls.fetch_add(1, std::memory_order_relaxed);
  return (probe ? kProbe : 0) | (((wanted.load(std::memory_order_relaxed) >> kind) & 1) ? kDeliver : 0);
}

// A signature's fingerprint: each tensor's dtype, rank and sizes, in order (add_to's tensors: a wrapped number is
// none). Two signatures with one fingerprint would keep only the first (a 64-bit mix: no collision in practice).
class Fingerprint {
 public:
  void add(const at::Tensor& t) {
    if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
    mix(static_cast<uint64_t>(t.scalar_type()) + 1);
    mix(static_cast<uint64_t>(t.dim()));
    for (int64_t s : t.sizes()) mix(static_cast<uint64_t>(s));
  }
  uint64_t value() const { return h_; }

 private:
  void mix(uint64_t v) { h_ = (h_ ^ v) * 0x100000001b3ull + (h_ >> 29); }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

bool printed(const OpStat& st, uint64_t print) {
  const size_t n = std::min(st.printed.load(std::memory_order_acquire), kMaxSignatures);
  for (size_t i = 0; i < n; ++i) {
    if (st.prints[i].load(std::memory_order_relaxed) == print) return true;
  }
  return false;
}

// Keeps a call's signature among the kind's first distinct ones, made by `make` only when it is new: a probe of an
// op called with the same shapes again, the common case, takes no lock and builds nothing.
void keep_signature(OpStat& st, uint64_t print, c10::function_ref<Signature()> make) {
  if (printed(st, print)) return;
  std::lock_guard<std::mutex> g(plans_mu);
  const size_t n = st.printed.load(std::memory_order_relaxed);
  if (n >= kMaxSignatures || printed(st, print)) return;
  st.signatures.push_back(make());
  st.prints[n].store(print, std::memory_order_relaxed);
  st.printed.store(n + 1, std::memory_order_release);
}

void keep_signature(OpStat& st, c10::ArrayRef<const at::Tensor*> tensors) {
  Fingerprint f;
  for (const at::Tensor* t : tensors) f.add(*t);
  keep_signature(st, f.value(), [&] { return signature_of(tensors); });
}

void keep_signature(OpStat& st, const Stack& args) {
  Fingerprint f;
  for (const auto& v : args) for_each_tensor(v, [&](const at::Tensor& t) { f.add(t); });
  keep_signature(st, f.value(), [&] { return signature_of(args); });
}

// A call's argument stack and signature, made only when a delivery calls Python (a call counted at its line, the
// common case, needs neither: a typed kernel's arguments are not even boxed).
struct Lazy {
  explicit Lazy(const Stack& args) : given(&args) {}
  explicit Lazy(c10::function_ref<Stack()> make) : make(make) {}
  std::optional<c10::function_ref<Stack()>> make;
  const Stack* given = nullptr;
  std::optional<Stack> made;
  std::optional<Signature> sig;
  const Stack& args() {
    if (given == nullptr) given = &made.emplace((*make)());
    return *given;
  }
  const Signature& signature() {
    if (!sig) sig = signature_of(args());
    return *sig;
  }
};

void deliver_lazily(Plan& p, int kind, const std::string& reason, int64_t host_ns, Lazy& lazy) {
  deliver(&p, p.name, p.overload, kind, reason, [&]() -> const Signature& { return lazy.signature(); }, host_ns,
          [&]() -> const Stack& { return lazy.args(); });
}

void examine(Plan& p, int kind, const std::string& reason, int64_t host_ns, const Stack& args, int wants) {
  if (wants & kProbe) keep_signature(p.stats[kind], args);
  if (wants & kDeliver) {
    Lazy lazy(args);
    deliver_lazily(p, kind, reason, host_ns, lazy);
  }
}

}  // namespace

void record(Plan& p, int kind, const std::string& reason, int64_t host_ns, const Stack& args) {
  if (int wants = count(p, kind, reason, host_ns)) examine(p, kind, reason, host_ns, args, wants);
}

void run(const c10::OperatorHandle& op, Stack* stack) {
  Plan& p = plan_of(op);
  if (p.on_device) {
    op.redispatchBoxed(kCPU, stack);
    return;
  }
  const size_t n = op.schema().arguments().size();
  Stack orig(std::make_move_iterator(stack->end() - n), std::make_move_iterator(stack->end()));
  stack->erase(stack->end() - n, stack->end());
  if (p.aborts.load(std::memory_order_relaxed)) abort_check(p.name, p.overload, orig);

  Call c(p);
  for (const auto& v : orig) c.find_device(v);
  Stack hargs;
  hargs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    bool written = std::find(p.write_args.begin(), p.write_args.end(), static_cast<int>(i)) != p.write_args.end();
    hargs.push_back(c.convert(orig[i], written));
  }
  if (c.device < 0) c.device = current_device();
  if (p.generator_arg >= 0 && hargs[p.generator_arg].isNone()) {
    hargs[p.generator_arg] = cpu_engine(default_generator(c.device));
  }
  const auto [kind, reason] = kind_of_call(kind_of(p, c.mask), orig);
  const bool wide = c.mask & rules.wide_mask;

  c10::ScalarType int_input = c10::ScalarType::Undefined;
  if (p.int_as_float && hargs[0].isTensor() && c10::isIntegralType(hargs[0].toTensor().scalar_type(), true)) {
    int_input = hargs[0].toTensor().scalar_type();
    hargs[0] = hargs[0].toTensor().to(at::kFloat);
  }
  bool drop_grad_input = false;
  if (p.always_grad_input && hargs.back().isBoolList()) {
    auto mask = hargs.back().toBoolList();
    if (!mask.empty() && !mask.get(0)) {
      c10::List<bool> wanted;
      for (size_t i = 0; i < mask.size(); ++i) wanted.push_back(i == 0 ? true : mask.get(i));
      hargs.back() = wanted;
      drop_grad_input = true;
    }
  }
  bool int32 = emulate_downcast.load() && ((c.mask >> static_cast<int>(at::kLong)) & 1) && !p.is_view &&
                     !p.keeps_int64 && !((rules.off_device_kinds >> kind) & 1) && !(c.mask & rules.host_mask);
  if (int32) int32 = wrap_int64_inputs(p, hargs);
  std::vector<Lowered> written;
  const bool lowered = wide && ((c.mask >> static_cast<int>(at::kDouble)) & 1) && !(c.mask & rules.host_mask) &&
                       downcast(p, orig, hargs, written);

  const bool traced = profiling();
  const int64_t w0 = traced ? profile_clock() : 0;
  const OpClock clock;  // its results, adopted below, take its time as their allocation time
  const size_t base = stack->size();
  auto call = [&] {
    for (const auto& v : hargs) stack->push_back(v);
    try {
      op.redispatchBoxed(kCPU, stack);
    } catch (const c10::Error& e) {
      if (p.write_args.empty() || std::string(e.what()).find("not resizable") == std::string::npos) throw;
      stack->resize(base);
      run_resizing(op, p, orig, hargs, stack);
      return;
    }
    if (!p.write_args.empty()) {
      c.settle_growth();
      sync_layouts(p, orig, hargs);
    }
  };
  {
    QuietHost quiet;  // profilers see the device op alone, as on TorchNeuron
    if (p.implicit_rng) {
      dropout_on_device(c.device, hargs, stack);
    } else {
      call();
    }
  }
  int64_t host_ns = clock.elapsed_ns();
  if (traced) trace_kernel(p.name, c.device, kind, w0, profile_clock());
  for (auto& [dev, low] : written) {  // a kernel may have resized the stand-in (an out= that must grow)
    if (dev.sizes() != low.sizes()) dev.resize_(low.sizes());
    host(dev).copy_(low);
  }
  if (int32) wrap_int64_written(p, orig);

  // Results: written arguments are returned as the caller's tensors; new results become device memory.
  const size_t m = p.write_returns.size();
  for (size_t i = 0; i < m; ++i) {
    auto& v = (*stack)[stack->size() - m + i];
    int slot = p.write_returns[i];
    if (slot >= 0) {
      v = orig[slot];
      continue;
    }
    if (int_input != c10::ScalarType::Undefined && v.isTensor()) v = v.toTensor().to(int_input);
    if (drop_grad_input && i == 0) v = at::Tensor();
    if (lowered) v = widened(v);
    if (int32) v = int32_result(v);
    v = c.back(v);
  }

  record(p, kind, *reason, host_ns, orig);
  if (p.data_dependent) sync_point(p, orig);
  if (wide) record(p, kDowncast, downcast_reason(c.mask), 0, orig);
}

namespace {

// The typed kernels' plain path: every tensor defined, on one device or a CPU scalar, no 64-bit dtype, no profiler,
// no quirk of the op in the policy (but drawing on the device's generator, for a kernel that does so itself). Its
// device and device dtypes; false: the call goes to run().
bool plain(const Plan& p, c10::ArrayRef<const at::Tensor*> tensors, c10::DeviceIndex* device, uint64_t* mask,
           bool draws_on_device = false) {
  if (p.on_device || p.int_as_float || (p.implicit_rng && !draws_on_device) || p.always_grad_input ||
      p.data_dependent || p.aborts.load(std::memory_order_relaxed) || profiling()) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) return false;
    if (t->device().type() == c10::DeviceType::PrivateUse1) {
      if (*device >= 0 && t->device().index() != *device) return false;
      *device = t->device().index();
      *mask |= uint64_t(1) << static_cast<int>(t->scalar_type());
    } else if (!t->is_cpu() || t->dim() != 0) {
      return false;
    }
  }
  return *device >= 0 && !(*mask & rules.wide_mask);
}

// How long a plain call took, from its start to its host kernel's end.
int64_t timed(const OpClock& clock, c10::function_ref<void()> kernel) {
  {
    QuietHost quiet;
    kernel();
  }
  return clock.elapsed_ns();
}

// Counts a plain call as run() would.
void tally(Plan& p, const Classified& kind, int64_t host_ns, c10::ArrayRef<const at::Tensor*> tensors,
           c10::function_ref<Stack()> args) {
  record(p, kind.kind, kind.reason, host_ns, tensors, args);
}

}  // namespace

void record(Plan& p, int kind, const std::string& reason, int64_t host_ns, c10::ArrayRef<const at::Tensor*> tensors,
            c10::function_ref<Stack()> args) {
  const int wants = count(p, kind, reason, host_ns);
  if (wants & kProbe) keep_signature(p.stats[kind], tensors);
  if (wants & kDeliver) {
    Lazy lazy(args);
    deliver_lazily(p, kind, reason, host_ns, lazy);
  }
}

at::Tensor direct(const c10::OperatorHandle& op, Plan& p, c10::ArrayRef<const at::Tensor*> tensors,
                  c10::function_ref<at::Tensor()> kernel, c10::function_ref<Stack()> args) {
  c10::DeviceIndex device = -1;
  uint64_t mask = 0;
  if (!plain(p, tensors, &device, &mask)) {
    Stack stack = args();
    run(op, &stack);
    return stack.back().toTensor();
  }
  const Classified& kind = kind_of(p, mask);
  if (!kind.tests.empty()) {  // an op with argument conditions: run() tests each call
    Stack stack = args();
    run(op, &stack);
    return stack.back().toTensor();
  }
  at::Tensor r;
  const OpClock clock;  // the result, pooled or presented below, takes its time as its allocation time
  int64_t host_ns = timed(clock, [&] { r = kernel(); });
  for (const at::Tensor* t : tensors) {  // a result over a CPU scalar's bytes is its own, as in Call::back
    if (t->is_cpu() && t->storage().unsafeGetStorageImpl() == r.storage().unsafeGetStorageImpl()) r = r.clone();
  }
  at::Tensor out = presented(std::move(r), device);
  tally(p, kind, host_ns, tensors, args);
  return out;
}

at::Tensor& direct_(const c10::OperatorHandle& op, Plan& p, at::Tensor& self, c10::ArrayRef<const at::Tensor*> tensors,
                    c10::function_ref<void()> kernel, c10::function_ref<Stack()> args) {
  c10::DeviceIndex device = -1;
  uint64_t mask = 0;
  if (self.device().type() != c10::DeviceType::PrivateUse1 || !plain(p, tensors, &device, &mask)) {
    Stack stack = args();
    run(op, &stack);
    return self;
  }
  const Classified& kind = kind_of(p, mask);
  if (!kind.tests.empty()) {
    Stack stack = args();
    run(op, &stack);
    return self;
  }
  const OpClock clock;
  tally(p, kind, timed(clock, kernel), tensors, args);
  return self;
}

bool direct_results(Plan& p, c10::ArrayRef<const at::Tensor*> tensors,
                    c10::function_ref<void(std::vector<at::Tensor>&)> kernel, c10::function_ref<Stack()> args,
                    std::vector<at::Tensor>& results, bool draws_on_device) {
  c10::DeviceIndex device = -1;
  uint64_t mask = 0;
  if (!plain(p, tensors, &device, &mask, draws_on_device)) return false;
  const Classified& kind = kind_of(p, mask);
  if (!kind.tests.empty()) return false;
  const OpClock clock;  // as direct()'s
  const int64_t host_ns = timed(clock, [&] { kernel(results); });
  for (at::Tensor& r : results) {
    if (!r.defined()) continue;
    for (const at::Tensor* t : tensors) {  // as direct(): a result over a CPU scalar's bytes is its own
      if (t->is_cpu() && t->storage().unsafeGetStorageImpl() == r.storage().unsafeGetStorageImpl()) r = r.clone();
    }
    r = presented(r, device);
  }
  tally(p, kind, host_ns, tensors, args);
  return true;
}

Plan& named(const char* name, const char* overload) {
  return plan_of(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
}

std::atomic<int> sync_kind{-1};

void set_sync_kind(int kind) {
  sync_kind = kind;
}

void sync_point(Plan& p, const Stack& args) {
  const int k = sync_kind.load();
  if (k < 0 || !((wanted.load() >> k) & 1)) return;
  Lazy lazy(args);
  deliver_lazily(p, k, "", 0, lazy);
}

void count_transfer(int64_t to_device, int64_t to_host) {
  h2d += to_device;
  d2h += to_host;
  h2d_total += to_device;
  d2h_total += to_host;
}

namespace {

void fallback(const c10::OperatorHandle& op, Stack* stack) {
  run(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

void register_direct(const std::vector<std::string>& names) {
  // Kept for the life of the process, like TORCH_LIBRARY_IMPL's static registrations.
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                        __LINE__);
  for (const auto& name : names) {
    if (!register_typed(*lib, name)) lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

// -- reading the aggregates --------------------------------------------------------------------------
std::vector<OpRow> op_rows() {
  std::vector<OpRow> rows;
  std::lock_guard<std::mutex> g(plans_mu);
  for (const auto& [_, p] : plans) {
    for (int k = 0; k < kMaxKinds; ++k) {
      const auto& st = p->stats[k];
      const int64_t n = st.count.load(std::memory_order_relaxed);
      if (n) rows.push_back({p->name, p->overload, st.reason, k, n, st.host_ns.load(std::memory_order_relaxed),
                             st.signatures});
    }
  }
  return rows;
}

void clear_op_rows() {
  {
    std::lock_guard<std::mutex> g(plans_mu);
    for (auto& [_, p] : plans) {
      for (auto& st : p->stats) {
        st.count.store(0, std::memory_order_relaxed);
        st.host_ns.store(0, std::memory_order_relaxed);
        st.reason.clear();
        st.signatures.clear();
        st.printed.store(0, std::memory_order_release);
      }
    }
  }
  h2d = 0;
  d2h = 0;
}

void forget_kinds() {
  std::lock_guard<std::mutex> g(plans_mu);
  for (auto& [_, p] : plans) {
    p->kinds.clear();
    p->last_kind.store(nullptr, std::memory_order_release);
  }
}

void set_wanted(int kinds_mask) {
  wanted = kinds_mask;
}

void set_policy(Policy policy) {
  std::lock_guard<std::mutex> g(plans_mu);
  rules = std::move(policy);
  for (auto& [_, p] : plans) apply_rules(*p);
}

void set_abort_ops(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> g(plans_mu);
  abort_names = std::unordered_set<std::string>(names.begin(), names.end());
  for (auto& [_, p] : plans) apply_rules(*p);
}

void set_emulate_downcast(bool on) {
  emulate_downcast = on;
}

int64_t op_calls() {
  return calls.load();
}

std::vector<int64_t> transfers() {
  return {h2d.load(), d2h.load(), h2d_total.load(), d2h_total.load()};
}

}  // namespace neuron_lab
