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
#include <ATen/ops/add_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/addcdiv_cpu_dispatch.h>
#include <ATen/ops/addcmul_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
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
#include <ATen/ops/where_cpu_dispatch.h>
#include <ATen/ops/zero_cpu_dispatch.h>

#include <cstring>
#include <type_traits>
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

// An argument as the CPU kernel takes it: a tensor's host alias, anything else as it is.
template <typename T>
decltype(auto) on_host(const T& v) {
  if constexpr (kIsTensor<T>) {
    return host(v);
  } else {
    return (v);
  }
}

// The tensors among a call's arguments, for direct()'s plain-path check.
template <typename... A>
c10::SmallVector<const at::Tensor*, 4> tensors_of(const A&... a) {
  c10::SmallVector<const at::Tensor*, 4> out;
  auto add = [&](const auto& v) {
    if constexpr (kIsTensor<decltype(v)>) out.push_back(&v);
  };
  (add(a), ...);
  return out;
}

// The typed kernel of a functional overload `Name` whose CPU kernel is `Cpu` (same C++ signature).
template <const char* Name, auto Cpu>
struct Functional;
template <const char* Name, typename... A, at::Tensor (*Cpu)(A...)>
struct Functional<Name, Cpu> {
  static at::Tensor call(A... a) {
    static Op op(Name);
    return direct(op.handle, op.plan, tensors_of(a...), [&] { return Cpu(on_host(a)...); },
                  [&] { return Stack{c10::IValue(a)...}; });
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

using T = at::Tensor;
using S = at::Scalar;

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
NL_NAME(kZero_, "zero_"); NL_NAME(kWhere, "where.self");
#undef NL_NAME

using Register = void (*)(torch::Library&, const char*);

template <typename K>
void reg(torch::Library& lib, const char* name) {
  lib.impl(name, TORCH_FN(K::call));
}

// Overload name -> its typed kernel's registration.
const std::unordered_map<std::string, Register>& typed() {
  static const std::unordered_map<std::string, Register> table = {
      {kAdd, reg<Functional<kAdd, static_cast<T (*)(const T&, const T&, const S&)>(&at::cpu::add)>>},
      {kAdd_, reg<InPlace<kAdd_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::add_)>>},
      {kAddS, reg<Functional<kAddS, static_cast<T (*)(const T&, const S&, const S&)>(
                                        &at::compositeexplicitautograd::add)>>},
      {kSub, reg<Functional<kSub, static_cast<T (*)(const T&, const T&, const S&)>(&at::cpu::sub)>>},
      {kSub_, reg<InPlace<kSub_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::sub_)>>},
      {kMul, reg<Functional<kMul, static_cast<T (*)(const T&, const T&)>(&at::cpu::mul)>>},
      {kMul_, reg<InPlace<kMul_, static_cast<T& (*)(T&, const T&)>(&at::cpu::mul_)>>},
      {kMulS, reg<Functional<kMulS, static_cast<T (*)(const T&, const S&)>(&at::compositeexplicitautograd::mul)>>},
      {kMulS_, reg<InPlace<kMulS_, static_cast<T& (*)(T&, const S&)>(&at::compositeexplicitautograd::mul_)>>},
      {kDiv, reg<Functional<kDiv, static_cast<T (*)(const T&, const T&)>(&at::cpu::div)>>},
      {kDiv_, reg<InPlace<kDiv_, static_cast<T& (*)(T&, const T&)>(&at::cpu::div_)>>},
      {kDivS, reg<Functional<kDivS, static_cast<T (*)(const T&, const S&)>(&at::compositeexplicitautograd::div)>>},
      {kNeg, reg<Functional<kNeg, &at::cpu::neg>>},
      {kSqrt, reg<Functional<kSqrt, &at::cpu::sqrt>>},
      {kRsqrt, reg<Functional<kRsqrt, &at::cpu::rsqrt>>},
      {kExp, reg<Functional<kExp, &at::cpu::exp>>},
      {kPow, reg<Functional<kPow, static_cast<T (*)(const T&, const S&)>(&at::cpu::pow)>>},
      {kMm, reg<Functional<kMm, &at::cpu::mm>>},
      {kAddmm, reg<Functional<kAddmm, &at::cpu::addmm>>},
      {kBmm, reg<Functional<kBmm, &at::cpu::bmm>>},
      {kRelu, reg<Functional<kRelu, &at::cpu::relu>>},
      {kThresholdBackward, reg<Functional<kThresholdBackward, &at::cpu::threshold_backward>>},
      {kGelu, reg<Functional<kGelu, &at::cpu::gelu>>},
      {kGeluBackward, reg<Functional<kGeluBackward, &at::cpu::gelu_backward>>},
      {kSilu, reg<Functional<kSilu, &at::cpu::silu>>},
      {kSiluBackward, reg<Functional<kSiluBackward, &at::cpu::silu_backward>>},
      {kTanh, reg<Functional<kTanh, &at::cpu::tanh>>},
      {kTanhBackward, reg<Functional<kTanhBackward, &at::cpu::tanh_backward>>},
      {kSigmoid, reg<Functional<kSigmoid, &at::cpu::sigmoid>>},
      {kSigmoidBackward, reg<Functional<kSigmoidBackward, &at::cpu::sigmoid_backward>>},
      {kSumDim, reg<Functional<kSumDim, &at::cpu::sum>>},
      {kMeanDim, reg<Functional<kMeanDim, &at::cpu::mean>>},
      {kLogSoftmax, reg<Functional<kLogSoftmax, &at::cpu::_log_softmax>>},
      {kLogSoftmaxBackward, reg<Functional<kLogSoftmaxBackward, &at::cpu::_log_softmax_backward_data>>},
      {kSoftmax, reg<Functional<kSoftmax, &at::cpu::_softmax>>},
      {kSoftmaxBackward, reg<Functional<kSoftmaxBackward, &at::cpu::_softmax_backward_data>>},
      {kAddcmul_, reg<InPlace<kAddcmul_, &at::cpu::addcmul_>>},
      {kAddcdiv_, reg<InPlace<kAddcdiv_, &at::cpu::addcdiv_>>},
      {kLerp_, reg<InPlace<kLerp_, static_cast<T& (*)(T&, const T&, const S&)>(&at::cpu::lerp_)>>},
      {kClone, reg<Functional<kClone, &at::compositeexplicitautograd::clone>>},
      {kFill_, reg<InPlace<kFill_, static_cast<T& (*)(T&, const S&)>(&at::cpu::fill_)>>},
      {kZero_, reg<InPlace<kZero_, &at::cpu::zero_>>},
      {kWhere, reg<Functional<kWhere, &at::cpu::where>>},
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

}  // namespace neuron_lab
