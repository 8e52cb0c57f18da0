// Typed PrivateUse1 kernels for the ops real models call most: the arguments reach the CPU kernel as they are,
// without the boxed fallback's stacks and its CPU redispatch. Counting, kinds and device memory are the fallback's
// own (direct() and direct_() in dispatch.cpp); every call off the plain path goes through the fallback itself.
#include "aten/unboxed.h"

#include "aten/dispatch.h"
#include "aten/host_alias.h"

#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/_foreach_add_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_foreach_div_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_foreach_mul_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_foreach_sub_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/add_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/addcdiv_cpu_dispatch.h>
#include <ATen/ops/addcmul_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/cat_cpu_dispatch.h>
#include <ATen/ops/clone_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/div_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/fill_cpu_dispatch.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/lerp_cpu_dispatch.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/native_dropout_backward_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_backward_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_cpu_dispatch.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/pow_cpu_dispatch.h>
#include <ATen/ops/relu_cpu_dispatch.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/sigmoid_backward_cpu_dispatch.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/silu_backward_cpu_dispatch.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/ops/tanh_backward_cpu_dispatch.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/threshold_backward_cpu_dispatch.h>
#include <ATen/ops/tril_cpu_dispatch.h>
#include <ATen/ops/where_cpu_dispatch.h>
#include <ATen/ops/zero_cpu_dispatch.h>

#include <ATen/ExpandUtils.h>
#include <ATen/ScalarOps.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <unordered_map>

namespace neuron_lab {
namespace {

// One overload's handle and plan, found once.
struct Op {
  c10::OperatorHandle handle;
  Plan& plan;
  explicit Op(const char* name)
      : handle(c10::Dispatcher::singleton().findSchemaOrThrow(base(name).c_str(), overload(name))),
        plan(plan_of(handle)) {}
  static std::string base(const char* name) {
    std::string s(name);
    return "aten::" + s.substr(0, s.find('.'));
  }
  static const char* overload(const char* name) {
    const char* dot = std::strchr(name, '.');
    return dot ? dot + 1 : "";
  }
};

template <typename T>
constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;
template <typename T>
constexpr bool kIsList = std::is_same_v<std::decay_t<T>, at::TensorList> ||
                         std::is_same_v<std::decay_t<T>, at::ITensorListRef>;
template <typename T>
constexpr bool kIsOptional = std::is_same_v<std::decay_t<T>, std::optional<at::Tensor>>;

// A list's members' host aliases (each its block's cached one).
template <typename L>
std::vector<at::Tensor> host_list(const L& l) {
  std::vector<at::Tensor> out;
  out.reserve(l.size());
  for (const at::Tensor& t : l) out.push_back(host(t));
  return out;
}

// An argument as the CPU kernel takes it: a tensor's host alias (a list's, an optional's), anything else as it is.
template <typename T>
decltype(auto) on_host(const T& v) {
  if constexpr (kIsTensor<T>) {
    return host(v);
  } else if constexpr (kIsList<T>) {
    return host_list(v);
  } else if constexpr (kIsOptional<T>) {
    return v ? std::optional<at::Tensor>(host(*v)) : std::nullopt;
  } else {
    return (v);
  }
}

// The tensors among a call's arguments, lists' members in order, for direct()'s plain-path check.
template <typename... A>
c10::SmallVector<const at::Tensor*, 4> tensors_of(const A&... a) {
  c10::SmallVector<const at::Tensor*, 4> out;
  auto add = [&](const auto& v) {
    if constexpr (kIsTensor<decltype(v)>) {
      out.push_back(&v);
    } else if constexpr (kIsList<decltype(v)>) {
      for (const at::Tensor& t : v) out.push_back(&t);
    } else if constexpr (kIsOptional<decltype(v)>) {
      if (v) out.push_back(&*v);
    }
  };
  (add(a), ...);
  return out;
}

c10::DeviceIndex device_of(c10::ArrayRef<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (t->device().type() == c10::DeviceType::PrivateUse1) return t->device().index();
  }
  return -1;
}

// A result of `sizes` in `dtype` on the tensors' device, made before a `.out` kernel runs into it (host_alias.h's
// `pooled`), when the dtype is floating and there are elements; else nothing (the functional kernel then runs).
// `contiguous`: the alias takes those sizes, contiguous, at once (the layout the kernel gives its result), so the
// `.out` kernel finds its out sized and neither resizes nor restrides it; else the kernel sizes it.
std::optional<Pooled> pooled_as(c10::ArrayRef<const at::Tensor*> tensors, caffe2::TypeMeta dtype,
                                c10::IntArrayRef sizes, bool contiguous = true) {
  const c10::DeviceIndex device = device_of(tensors);
  const int64_t numel = c10::multiply_integers(sizes);
  if (device < 0 || numel <= 0 || !at::isFloatingType(c10::typeMetaToScalarType(dtype))) return std::nullopt;
  return pooled(device, dtype, static_cast<size_t>(numel) * dtype.itemsize(),
                contiguous ? std::optional<c10::IntArrayRef>(sizes) : std::nullopt);
}

// An elementwise result's device memory, when the tensors are all of one floating dtype (the result's then; a
// wrapped Python number that is not complex changes neither it nor the sizes) and contiguous; else nothing. Of
// tensors all of the result's sizes the result is contiguous too; a broadcast one's layout is TensorIterator's.
std::optional<Pooled> pooled_elementwise(c10::ArrayRef<const at::Tensor*> tensors) {
  const at::Tensor* first = nullptr;
  at::DimVector sizes;
  bool same = true;
  for (const at::Tensor* t : tensors) {
    if (t->unsafeGetTensorImpl()->is_wrapped_number()) {
      if (at::isComplexType(t->scalar_type())) return std::nullopt;
    } else if (!t->is_contiguous()) {  // a restrided out costs more than the CPU result it saves
      return std::nullopt;
    } else if (!first) {
      first = t;
      sizes.assign(t->sizes().begin(), t->sizes().end());
    } else if (t->dtype() != first->dtype()) {
      return std::nullopt;
    } else if (!t->sizes().equals(sizes)) {
      sizes = at::infer_size_dimvector(sizes, t->sizes());
      same = false;
    }
  }
  if (!first) return std::nullopt;
  return pooled_as(tensors, first->dtype(), sizes, same);
}

// The result's memory of each kernel with a `.out` one, from its arguments (the functional overload's), before the
// call: only where its dtype and sizes are certain and the call cannot raise for them; else nothing. Each of these
// `.out` kernels makes a contiguous result.
using TPs = c10::ArrayRef<const at::Tensor*>;
// With a Python number as a Scalar argument (`x * 0.5`, `x ** 2`): a complex one changes the result's dtype.
std::optional<Pooled> with_scalar(TPs tensors, const at::Tensor&, const at::Scalar& s) {
  return s.isComplex() ? std::nullopt : pooled_elementwise(tensors);
}
bool same_dtype(TPs tensors) {
  for (const at::Tensor* t : tensors) {
    if (t->dtype() != tensors[0]->dtype()) return false;
  }
  return true;
}
std::optional<Pooled> mm_result(TPs tensors, const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || !same_dtype(tensors)) return std::nullopt;
  return pooled_as(tensors, a.dtype(), {a.size(0), b.size(1)});
}
std::optional<Pooled> bmm_result(TPs tensors, const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0) || a.size(2) != b.size(1) || !same_dtype(tensors)) {
    return std::nullopt;
  }
  return pooled_as(tensors, a.dtype(), {a.size(0), a.size(1), b.size(2)});
}
std::optional<Pooled> addmm_result(TPs tensors, const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                                   const at::Scalar& beta, const at::Scalar& alpha) {
  if (beta.isComplex() || alpha.isComplex() || a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) ||
      !same_dtype(tensors) || !at::is_expandable_to(self.sizes(), {a.size(0), b.size(1)})) {
    return std::nullopt;
  }
  return pooled_as(tensors, a.dtype(), {a.size(0), b.size(1)});
}
// sum.dim_IntList, mean.dim: the sizes left after the dims (all of them for none) in self's dtype.
std::optional<Pooled> reduced(TPs tensors, const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                              std::optional<at::ScalarType> dtype) {
  const int64_t n = self.dim();
  if (n == 0 || n > 64 || (dtype && *dtype != self.scalar_type())) return std::nullopt;
  uint64_t gone = 0;
  if (!dim || dim->empty()) {
    gone = ~uint64_t(0);
  } else {
    for (int64_t d : *dim) {
      if (d < -n || d >= n) return std::nullopt;
      const uint64_t bit = uint64_t(1) << (d < 0 ? d + n : d);
      if (gone & bit) return std::nullopt;  // a repeated dim raises
      gone |= bit;
    }
  }
  at::DimVector sizes;
  for (int64_t d = 0; d < n; ++d) {
    if (!((gone >> d) & 1)) {
      sizes.push_back(self.size(d));
    } else if (keepdim) {
      sizes.push_back(1);
    }
  }
  return pooled_as(tensors, self.dtype(), sizes);
}
// _softmax, _log_softmax: self's sizes and dtype (half_to_float makes float).
std::optional<Pooled> softmaxed(TPs tensors, const at::Tensor& self, int64_t dim, bool half_to_float) {
  const int64_t n = std::max<int64_t>(self.dim(), 1);
  if (half_to_float || dim < -n || dim >= n) return std::nullopt;
  return pooled_as(tensors, self.dtype(), self.sizes());
}
// Their backwards: grad_output's sizes, in input_dtype.
std::optional<Pooled> softmax_grad(TPs tensors, const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                                   at::ScalarType input_dtype) {
  const int64_t n = std::max<int64_t>(grad.dim(), 1);
  if (input_dtype != grad.scalar_type() || !same_dtype(tensors) || !grad.sizes().equals(output.sizes()) || dim < -n ||
      dim >= n) {
    return std::nullopt;
  }
  return pooled_as(tensors, grad.dtype(), grad.sizes());
}
// clone, in self's layout where empty_like keeps it (preserve, over non-overlapping and dense bytes): clone_out
// gives the alias that layout.
std::optional<Pooled> cloned(TPs tensors, const at::Tensor& self, std::optional<at::MemoryFormat> format) {
  if ((format && *format != at::MemoryFormat::Preserve) || !self.is_non_overlapping_and_dense()) return std::nullopt;
  return pooled_as(tensors, self.dtype(), self.sizes(), false);
}

// `.out` kernels of the overloads whose CPU kernel is a composite: the composite's own steps, into `out`.
at::Tensor& mul_scalar_out(at::Tensor& out, const at::Tensor& self, const at::Scalar& other) {
  return at::cpu::mul_out(out, self, at::native::wrapped_scalar_tensor(other));
}
at::Tensor& div_scalar_out(at::Tensor& out, const at::Tensor& self, const at::Scalar& other) {
  return at::cpu::div_out(out, self, at::native::wrapped_scalar_tensor(other));
}
at::Tensor& clone_out(at::Tensor& out, const at::Tensor& self, std::optional<at::MemoryFormat>) {
  out.unsafeGetTensorImpl()->set_sizes_and_strides(self.sizes(), self.strides(), 0);
  return out.copy_(self);
}

// The typed kernel of a functional overload `Name` whose CPU kernel is `Cpu` (same C++ signature). One may name
// its `.out` kernel `Out` (the result first) and how its result's memory is made before the call, `Result`
// (elementwise's by default): its result is then written into pooled device memory.
template <const char* Name, auto Cpu, auto Out = nullptr, auto Result = nullptr>
struct Functional;
template <const char* Name, typename... A, at::Tensor (*Cpu)(A...), auto Out, auto Result>
struct Functional<Name, Cpu, Out, Result> {
  static at::Tensor call(A... a) {
    static Op op(Name);
    auto tensors = tensors_of(a...);
    return direct(op.handle, op.plan, tensors, [&] {
      if constexpr (!std::is_null_pointer_v<decltype(Out)>) {
        std::optional<Pooled> p;
        if constexpr (std::is_null_pointer_v<decltype(Result)>) {
          p = pooled_elementwise(tensors);
        } else {
          p = Result(tensors, a...);
        }
        if (p) {
          Out(*p->host, on_host(a)...);
          return settled(std::move(*p));
        }
      }
      return Cpu(on_host(a)...);
    }, [&] { return Stack{c10::IValue(a)...}; });
  }
};

// The same for an in-place overload: the CPU kernel writes self's host alias.
template <const char* Name, auto Cpu>
struct InPlace;
template <const char* Name, typename... A, at::Tensor& (*Cpu)(at::Tensor&, A...)>
struct InPlace<Name, Cpu> {
  static at::Tensor& call(at::Tensor& self, A... a) {
    static Op op(Name);
    return direct_(op.handle, op.plan, self, tensors_of(self, a...), [&] {
      at::Tensor h = host(self);
      Cpu(h, on_host(a)...);
    }, [&] { return Stack{self, c10::IValue(a)...}; });
  }
};

// The same for an in-place `_foreach_` overload: one host kernel over the lists' host aliases writes self's members
// in place, so no device result is made. A list with a member off the device goes through the fallback.
template <const char* Name, auto Cpu>
struct ForeachInPlace;
template <const char* Name, typename... A, void (*Cpu)(at::TensorList, A...)>
struct ForeachInPlace<Name, Cpu> {
  static void call(at::TensorList self, A... a) {
    static Op op(Name);
    auto args = [&] { return c10::impl::boxArgs<at::TensorList, A...>(self, a...); };
    bool on_device = !self.empty();
    for (const at::Tensor& t : self) on_device = on_device && t.device().type() == c10::DeviceType::PrivateUse1;
    if (!on_device) {
      Stack stack = args();
      run(op.handle, &stack);
      return;
    }
    at::Tensor first = self.front();
    direct_(op.handle, op.plan, first, tensors_of(self, a...), [&] {
      auto h = host_list(self);
      Cpu(h, on_host(a)...);
    }, args);
  }
};

// A tuple's results, one after another, and back.
template <typename R>
void flatten(R&& r, std::vector<at::Tensor>& out) {
  std::apply([&](auto&... t) { (out.push_back(std::move(t)), ...); }, r);
}
template <typename R, size_t... I>
R unflatten(std::vector<at::Tensor>& v, std::index_sequence<I...>) {
  return R(std::move(v[I])...);
}

// The typed kernel of an overload with several results (a tuple of tensors).
template <const char* Name, auto Cpu>
struct Results;
template <const char* Name, typename R, typename... A, R (*Cpu)(A...)>
struct Results<Name, Cpu> {
  static R call(A... a) {
    static Op op(Name);
    auto args = [&] { return c10::impl::boxArgs<A...>(a...); };
    std::vector<at::Tensor> out;
    if (!direct_results(op.plan, tensors_of(a...), [&](std::vector<at::Tensor>& r) { flatten(Cpu(on_host(a)...), r); },
                        args, out)) {
      Stack stack = args();
      run(op.handle, &stack);
      return c10::impl::PopResult<R>::call(stack);
    }
    return unflatten<R>(out, std::make_index_sequence<std::tuple_size_v<R>>());
  }
};

// native_dropout draws from the device's generator (dropout_on_host), so its typed kernel is its own. An empty
// input's output is the input itself, which the fallback presents as its alias.
constexpr char kDropout[] = "native_dropout";
struct NativeDropout {
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& input, double p, std::optional<bool> train) {
    static Op op(kDropout);
    auto args = [&] { return Stack{input, p, train}; };
    std::vector<at::Tensor> out;
    if (input.numel() == 0 ||
        !direct_results(op.plan, tensors_of(input), [&](std::vector<at::Tensor>& r) {
          flatten(dropout_on_host(input.device().index(), host(input), p, train), r);
        }, args, out, /*draws_on_device=*/true)) {
      Stack stack = args();
      run(op.handle, &stack);
      return c10::impl::PopResult<std::tuple<at::Tensor, at::Tensor>>::call(stack);
    }
    return {out[0], out[1]};
  }
};

using T = at::Tensor;
using S = at::Scalar;
using TL = at::TensorList;
using SL = at::ArrayRef<at::Scalar>;

#define NL_NAME(var, name) constexpr char var[] = name
NL_NAME(kAdd, "add.Tensor"); NL_NAME(kAdd_, "add_.Tensor"); NL_NAME(kAddS, "add.Scalar");
NL_NAME(kSub, "sub.Tensor"); NL_NAME(kSub_, "sub_.Tensor"); NL_NAME(kMul, "mul.Tensor"); NL_NAME(kMul_, "mul_.Tensor");
NL_NAME(kMulS, "mul.Scalar"); NL_NAME(kMulS_, "mul_.Scalar"); NL_NAME(kDiv, "div.Tensor"); NL_NAME(kDiv_, "div_.Tensor");
NL_NAME(kDivS, "div.Scalar"); NL_NAME(kNeg, "neg"); NL_NAME(kSqrt, "sqrt"); NL_NAME(kRsqrt, "rsqrt"); NL_NAME(kExp, "exp");
NL_NAME(kPow, "pow.Tensor_Scalar"); NL_NAME(kMm, "mm"); NL_NAME(kAddmm, "addmm"); NL_NAME(kBmm, "bmm");
NL_NAME(kRelu, "relu"); NL_NAME(kThresholdBackward, "threshold_backward"); NL_NAME(kGelu, "gelu");
NL_NAME(kGeluBackward, "gelu_backward"); NL_NAME(kSilu, "silu"); NL_NAME(kSiluBackward, "silu_backward");
NL_NAME(kTanh, "tanh"); NL_NAME(kTanhBackward, "tanh_backward"); NL_NAME(kSigmoid, "sigmoid");
NL_NAME(kSigmoidBackward, "sigmoid_backward"); NL_NAME(kSumDim, "sum.dim_IntList"); NL_NAME(kMeanDim, "mean.dim");
NL_NAME(kLogSoftmax, "_log_softmax"); NL_NAME(kLogSoftmaxBackward, "_log_softmax_backward_data");
NL_NAME(kSoftmax, "_softmax"); NL_NAME(kSoftmaxBackward, "_softmax_backward_data"); NL_NAME(kAddcmul_, "addcmul_");
NL_NAME(kAddcdiv_, "addcdiv_"); NL_NAME(kLerp_, "lerp_.Scalar"); NL_NAME(kClone, "clone"); NL_NAME(kFill_, "fill_.Scalar");
NL_NAME(kZero_, "zero_"); NL_NAME(kWhere, "where.self"); NL_NAME(kCat, "cat"); NL_NAME(kTril, "tril");
NL_NAME(kLayerNorm, "native_layer_norm"); NL_NAME(kLayerNormBackward, "native_layer_norm_backward");
NL_NAME(kDropoutBackward, "native_dropout_backward");
// In-place overloads of the `_foreach_` ops TorchNeuron registers (runtime.direct_ops): the name and the CPU kernel's
// C++ signature after self.
#define NL_FOREACH(X)                                                                                       \
  X(add_, Scalar, const S&) X(add_, List, TL, const S&) X(add_, ScalarList, SL) X(add_, Tensor, const T&, const S&) \
  X(sub_, Scalar, const S&) X(sub_, List, TL, const S&) X(sub_, ScalarList, SL)                                 \
  X(mul_, Scalar, const S&) X(mul_, List, TL) X(mul_, ScalarList, SL) X(mul_, Tensor, const T&)                 \
  X(div_, Scalar, const S&) X(div_, List, TL) X(div_, ScalarList, SL) X(div_, Tensor, const T&)
#define NL_FOREACH_NAME(base, ov, ...) NL_NAME(kForeach_##base##ov, "_foreach_" #base "." #ov);
NL_FOREACH(NL_FOREACH_NAME)
#undef NL_FOREACH_NAME
#undef NL_NAME

using Register = void (*)(torch::Library&, const char*);

template <typename K>
void reg(torch::Library& lib, const char* name) {
  lib.impl(name, TORCH_FN(K::call));
}

// Overload name -> its typed kernel's registration.
const std::unordered_map<std::string, Register>& typed() {
  static const std::unordered_map<std::string, Register> table = {
      {kAdd, reg<Functional<kAdd, static_cast<T (*)(const T&, const T&, const S&)>(&at::cpu::add),
                            static_cast<T& (*)(T&, const T&, const T&, const S&)>(&at::cpu::add_out)>>},
      {kAdd_, reg<InPlace<kAdd_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::add_)>>},
      {kAddS, reg<Functional<kAddS, static_cast<T (*)(const T&, const S&, const S&)>(
                                        &at::compositeexplicitautograd::add)>>},
      {kSub, reg<Functional<kSub, static_cast<T (*)(const T&, const T&, const S&)>(&at::cpu::sub),
                            static_cast<T& (*)(T&, const T&, const T&, const S&)>(&at::cpu::sub_out)>>},
      {kSub_, reg<InPlace<kSub_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::sub_)>>},
      {kMul, reg<Functional<kMul, static_cast<T (*)(const T&, const T&)>(&at::cpu::mul),
                            static_cast<T& (*)(T&, const T&, const T&)>(&at::cpu::mul_out)>>},
      {kMul_, reg<InPlace<kMul_, static_cast<T& (*)(T&, const T&)>(&at::cpu::mul_)>>},
      {kMulS, reg<Functional<kMulS, static_cast<T (*)(const T&, const S&)>(&at::compositeexplicitautograd::mul),
                             &mul_scalar_out, &with_scalar>>},
      {kMulS_, reg<InPlace<kMulS_, static_cast<T& (*)(T&, const S&)>(&at::compositeexplicitautograd::mul_)>>},
      {kDiv, reg<Functional<kDiv, static_cast<T (*)(const T&, const T&)>(&at::cpu::div),
                            static_cast<T& (*)(T&, const T&, const T&)>(&at::cpu::div_out)>>},
      {kDiv_, reg<InPlace<kDiv_, static_cast<T& (*)(T&, const T&)>(&at::cpu::div_)>>},
      {kDivS, reg<Functional<kDivS, static_cast<T (*)(const T&, const S&)>(&at::compositeexplicitautograd::div),
                             &div_scalar_out, &with_scalar>>},
      {kNeg, reg<Functional<kNeg, &at::cpu::neg, &at::cpu::neg_out>>},
      {kSqrt, reg<Functional<kSqrt, &at::cpu::sqrt, &at::cpu::sqrt_out>>},
      {kRsqrt, reg<Functional<kRsqrt, &at::cpu::rsqrt, &at::cpu::rsqrt_out>>},
      {kExp, reg<Functional<kExp, &at::cpu::exp, &at::cpu::exp_out>>},
      {kPow, reg<Functional<kPow, static_cast<T (*)(const T&, const S&)>(&at::cpu::pow),
                            static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::pow_out), &with_scalar>>},
      {kMm, reg<Functional<kMm, &at::cpu::mm, &at::cpu::mm_out, &mm_result>>},
      {kAddmm, reg<Functional<kAddmm, &at::cpu::addmm, &at::cpu::addmm_out, &addmm_result>>},
      {kBmm, reg<Functional<kBmm, &at::cpu::bmm, &at::cpu::bmm_out, &bmm_result>>},
      {kRelu, reg<Functional<kRelu, &at::cpu::relu>>},
      {kThresholdBackward, reg<Functional<kThresholdBackward, &at::cpu::threshold_backward, &at::cpu::threshold_backward_out>>},
      {kGelu, reg<Functional<kGelu, &at::cpu::gelu, &at::cpu::gelu_out>>},
      {kGeluBackward, reg<Functional<kGeluBackward, &at::cpu::gelu_backward, &at::cpu::gelu_backward_out>>},
      {kSilu, reg<Functional<kSilu, &at::cpu::silu, &at::cpu::silu_out>>},
      {kSiluBackward, reg<Functional<kSiluBackward, &at::cpu::silu_backward, &at::cpu::silu_backward_out>>},
      {kTanh, reg<Functional<kTanh, &at::cpu::tanh, &at::cpu::tanh_out>>},
      {kTanhBackward, reg<Functional<kTanhBackward, &at::cpu::tanh_backward, &at::cpu::tanh_backward_out>>},
      {kSigmoid, reg<Functional<kSigmoid, &at::cpu::sigmoid, &at::cpu::sigmoid_out>>},
      {kSigmoidBackward, reg<Functional<kSigmoidBackward, &at::cpu::sigmoid_backward, &at::cpu::sigmoid_backward_out>>},
      {kSumDim, reg<Functional<kSumDim, &at::cpu::sum, &at::cpu::sum_out, &reduced>>},
      {kMeanDim, reg<Functional<kMeanDim, &at::cpu::mean, &at::cpu::mean_out, &reduced>>},
      {kLogSoftmax, reg<Functional<kLogSoftmax, &at::cpu::_log_softmax, &at::cpu::_log_softmax_out, &softmaxed>>},
      {kLogSoftmaxBackward, reg<Functional<kLogSoftmaxBackward, &at::cpu::_log_softmax_backward_data,
                                           &at::cpu::_log_softmax_backward_data_out, &softmax_grad>>},
      {kSoftmax, reg<Functional<kSoftmax, &at::cpu::_softmax, &at::cpu::_softmax_out, &softmaxed>>},
      {kSoftmaxBackward, reg<Functional<kSoftmaxBackward, &at::cpu::_softmax_backward_data,
                                        &at::cpu::_softmax_backward_data_out, &softmax_grad>>},
      {kAddcmul_, reg<InPlace<kAddcmul_, &at::cpu::addcmul_>>},
      {kAddcdiv_, reg<InPlace<kAddcdiv_, &at::cpu::addcdiv_>>},
      {kLerp_, reg<InPlace<kLerp_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::lerp_)>>},
      {kClone, reg<Functional<kClone, &at::compositeexplicitautograd::clone, &clone_out, &cloned>>},
      {kFill_, reg<InPlace<kFill_, static_cast<T& (*)(T&, const S&)>(&at::cpu::fill_)>>},
      {kZero_, reg<InPlace<kZero_, &at::cpu::zero_>>},
      {kWhere, reg<Functional<kWhere, &at::cpu::where>>},
      {kCat, reg<Functional<kCat, &at::cpu::cat>>},
      {kDropout, reg<NativeDropout>},
      {kTril, reg<Functional<kTril, &at::cpu::tril_symint>>},
      {kLayerNorm, reg<Results<kLayerNorm, &at::cpu::native_layer_norm_symint>>},
      {kLayerNormBackward, reg<Results<kLayerNormBackward, &at::cpu::native_layer_norm_backward_symint>>},
      {kDropoutBackward, reg<Functional<kDropoutBackward, &at::cpu::native_dropout_backward>>},
#define NL_FOREACH_ENTRY(base, ov, ...)                                                      \
  {kForeach_##base##ov, reg<ForeachInPlace<kForeach_##base##ov, static_cast<void (*)(TL, __VA_ARGS__)>( \
                                                                    &at::compositeexplicitautograd::_foreach_##base)>>},
      NL_FOREACH(NL_FOREACH_ENTRY)
#undef NL_FOREACH_ENTRY
  };
  return table;
}

}  // namespace

bool register_typed(torch::Library& lib, const std::string& name) {
  auto it = typed().find(name);
  if (it == typed().end()) return false;
  it->second(lib, name.c_str());
  return true;
}

std::vector<std::string> typed_names() {
  std::vector<std::string> out;
  for (const auto& [name, _] : typed()) out.push_back(name);
  return out;
}

}  // namespace neuron_lab
