// Typed PrivateUse1 kernels for the functional ops real models call most: the arguments reach the CPU kernel as they
// are, without the boxed fallback's stacks and its CPU redispatch. Counting, kinds and device memory are the
// fallback's own (direct() in dispatch.cpp); every call off the plain path goes through the fallback itself.
#include "aten/unboxed.h"

#include "aten/dispatch.h"
#include "aten/host_alias.h"

#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>

namespace neuron_lab {
namespace {

// One overload's handle and plan, found once.
struct Op {
  c10::OperatorHandle handle;
  Plan& plan;
  Op(const char* name, const char* overload)
      : handle(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)), plan(plan_of(handle)) {}
};

// Two tensors (mul, div, mm, bmm).
template <const char* Name, const char* Overload, at::Tensor (*Cpu)(const at::Tensor&, const at::Tensor&)>
at::Tensor two(const at::Tensor& self, const at::Tensor& other) {
  static Op op(Name, Overload);
  return direct(op.handle, op.plan, {&self, &other}, [&] { return Cpu(host(self), host(other)); },
                [&] { return Stack{self, other}; });
}

// Two tensors and a scale of the second (add, sub).
template <const char* Name, at::Tensor (*Cpu)(const at::Tensor&, const at::Tensor&, const at::Scalar&)>
at::Tensor scaled(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static Op op(Name, "Tensor");
  return direct(op.handle, op.plan, {&self, &other}, [&] { return Cpu(host(self), host(other), alpha); },
                [&] { return Stack{self, other, alpha}; });
}

constexpr char kAdd[] = "aten::add", kSub[] = "aten::sub", kMul[] = "aten::mul", kDiv[] = "aten::div",
               kMm[] = "aten::mm", kBmm[] = "aten::bmm", kTensor[] = "Tensor", kDefault[] = "";

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  static Op op("aten::addmm", "");
  return direct(op.handle, op.plan, {&self, &mat1, &mat2},
                [&] { return at::cpu::addmm(host(self), host(mat1), host(mat2), beta, alpha); },
                [&] { return Stack{self, mat1, mat2, beta, alpha}; });
}

}  // namespace

bool register_typed(torch::Library& lib, const std::string& name) {
  if (name == "add.Tensor") {
    lib.impl("add.Tensor", TORCH_FN((scaled<kAdd, &at::cpu::add>)));
  } else if (name == "sub.Tensor") {
    lib.impl("sub.Tensor", TORCH_FN((scaled<kSub, &at::cpu::sub>)));
  } else if (name == "mul.Tensor") {
    lib.impl("mul.Tensor", TORCH_FN((two<kMul, kTensor, &at::cpu::mul>)));
  } else if (name == "div.Tensor") {
    lib.impl("div.Tensor", TORCH_FN((two<kDiv, kTensor, &at::cpu::div>)));
  } else if (name == "mm") {
    lib.impl("mm", TORCH_FN((two<kMm, kDefault, &at::cpu::mm>)));
  } else if (name == "bmm") {
    lib.impl("bmm", TORCH_FN((two<kBmm, kDefault, &at::cpu::bmm>)));
  } else if (name == "addmm") {
    lib.impl("addmm", TORCH_FN(addmm));
  } else {
    return false;
  }
  return true;
}

}  // namespace neuron_lab
