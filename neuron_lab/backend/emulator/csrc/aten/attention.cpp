// Scaled dot-product attention as TorchNeuron runs it (SdpBackendSelection.cpp): the same choice registered for
// PrivateUse1, and the fused overrideable op and its backward, whose composite kernels raise. Their host kernels
// are CPU kernels the boxed fallback runs on host aliases, so each call is reported as itself, with its call site
// and the coverage's kind. The pure-Python core computes the same way (neuron_lab/backend/emulator/attention.py
// says how: the CPU's flash kernels without dropout where they accept the arguments, else the closed form; dropout's
// mask from a seed drawn from the default CPU generator, returned as philox_seed for backward).
#include "aten/dispatch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

namespace neuron_lab {
namespace {

constexpr int64_t kMath = 0, kOverrideable = 4;  // SDPBackend's values

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& /*attn_mask*/, double /*dropout_p*/, bool /*is_causal*/,
                         std::optional<double> /*scale*/, bool /*enable_gqa*/) {
  if (query.device().type() != c10::DeviceType::PrivateUse1) return kMath;
  return query.dim() == 4 && key.dim() == 4 && value.dim() == 4 ? kOverrideable : kMath;
}

using Opt = std::optional<at::Tensor>;

bool reduced(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

at::Tensor acc(const at::Tensor& t) {
  return t.defined() && reduced(t) ? t.to(at::kFloat) : t;
}

at::Tensor batched(const at::Tensor& t) {
  return t.defined() && t.dim() == 3 ? t.unsqueeze(0) : t;
}

// Whether the CPU's flash kernels take these arguments (they raise on the others).
bool flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double dropout_p) {
  const int64_t d = q.size(-1);
  return dropout_p == 0.0 && q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
         q.size(1) == k.size(1) && k.size(-1) == d && v.size(-1) == d &&
         (!bias.defined() || ((bias.dim() == 2 || bias.dim() == 4) && bias.scalar_type() == q.scalar_type()));
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
}

// The probabilities (0 where a row is all masked, as PyTorch's math does), their logsumexp, and the dropout factor
// (the kept entries' 1 / (1 - p), else 0; undefined without dropout). Inputs in the accumulation dtype, key and value
// repeated to the query's heads.
struct Math {
  at::Tensor p, lse, drop;
};

Math math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& bias, double dropout_p, bool is_causal,
          double scale, int64_t seed) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (is_causal) {
    s = s.masked_fill(at::ones({s.size(-2), s.size(-1)}, at::kBool).tril().logical_not(), -inf);
  }
  if (bias.defined()) {
    s = s + (bias.scalar_type() == at::kBool
                 ? at::zeros_like(bias, s.options()).masked_fill(bias.logical_not(), -inf)
                 : bias.to(s.scalar_type()));
  }
  Math m{at::_safe_softmax(s, -1), at::logsumexp(s, {-1}), {}};
  if (dropout_p > 0.0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    at::Tensor keep = at::empty(m.p.sizes(), at::kFloat).bernoulli_(1.0 - dropout_p, gen).to(at::kBool);
    m.drop = keep * (dropout_p >= 1.0 ? 0.0 : 1.0 / (1.0 - dropout_p));
  }
  return m;
}

// The same draw as attention.py's `torch.empty((), dtype=torch.int32).random_()`; int32, as it says why.
int64_t draw_seed() {
  return at::empty({}, at::kInt).random_().item<int>();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
fused_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const Opt& attn_bias,
                double dropout_p, bool is_causal, bool /*return_debug_mask*/, std::optional<double> scale) {
  at::Tensor q = batched(query), k = batched(key), v = batched(value), bias = batched(attn_bias.value_or(at::Tensor()));
  const double sc = scale_of(q, scale);
  const int64_t seed = dropout_p > 0.0 ? draw_seed() : 0;
  at::Tensor out, lse;
  if (flash(q, k, v, bias, dropout_p)) {
    std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal,
                                                                          bias.defined() ? Opt(bias) : std::nullopt, sc);
  } else {
    const int64_t g = q.size(1) / k.size(1);
    at::Tensor va = acc(v.repeat_interleave(g, 1));
    Math m = math(acc(q), acc(k.repeat_interleave(g, 1)), acc(bias), dropout_p, is_causal, sc, seed);
    out = at::matmul(m.drop.defined() ? m.p * m.drop : m.p, va).to(q.scalar_type());
    lse = m.lse;
  }
  if (query.dim() == 3) out = out.squeeze(0);
  return {out,
          lse.to(at::kFloat),
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(q.size(2)),
          c10::SymInt(k.size(2)),
          at::scalar_tensor(seed, at::kInt),
          at::scalar_tensor(0, at::kInt),
          at::Tensor()};
}

// A broadcast argument's gradient: summed over the dimensions it was broadcast along.
at::Tensor sum_to(const at::Tensor& grad, const at::Tensor& like) {
  const int64_t lead = grad.dim() - like.dim();
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < grad.dim(); ++i) {
    if (i < lead || (like.size(i - lead) == 1 && grad.size(i) != 1)) dims.push_back(i);
  }
  return dims.empty() ? grad : grad.sum(dims, true).reshape(like.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
    c10::SymInt /*max_q*/, c10::SymInt /*max_k*/, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& /*philox_offset*/, std::optional<double> scale) {
  at::Tensor go = batched(grad_out), q = batched(query), k = batched(key), v = batched(value), o = batched(out);
  at::Tensor bias = batched(attn_bias);
  const double sc = scale_of(q, scale);
  const bool want_bias = bias.defined() && grad_input_mask[3];
  at::Tensor dq, dk, dv, db;
  if (flash(q, k, v, bias, dropout_p) && !want_bias) {
    // the flash kernel's own logsumexp dtype
    at::Tensor lse = q.scalar_type() == at::kDouble ? logsumexp.to(at::kDouble) : logsumexp;
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        go, q, k, v, o, lse, 0.0, is_causal, bias.defined() ? Opt(bias) : std::nullopt, sc);
  } else {
    const int64_t g = q.size(1) / k.size(1);
    at::Tensor goa = acc(go), qa = acc(q), ka = acc(k.repeat_interleave(g, 1)), va = acc(v.repeat_interleave(g, 1));
    Math m = math(qa, ka, acc(bias), dropout_p, is_causal, sc, philox_seed.item<int>());
    dv = at::matmul((m.drop.defined() ? m.p * m.drop : m.p).transpose(-2, -1), goa);
    at::Tensor dp = at::matmul(goa, va.transpose(-2, -1));
    if (m.drop.defined()) dp = dp * m.drop;
    at::Tensor ds = m.p * (dp - (dp * m.p).sum(-1, true));
    dq = at::matmul(ds, ka) * sc;
    dk = at::matmul(ds.transpose(-2, -1), qa) * sc;
    if (g > 1) {
      dk = dk.unflatten(1, {k.size(1), g}).sum(2);
      dv = dv.unflatten(1, {k.size(1), g}).sum(2);
    }
    if (want_bias) db = sum_to(ds, bias).to(bias.scalar_type());
    dq = dq.to(q.scalar_type());
    dk = dk.to(k.scalar_type());
    dv = dv.to(v.scalar_type());
  }
  if (query.dim() == 3) {
    dq = dq.squeeze(0);
    dk = dk.squeeze(0);
    dv = dv.squeeze(0);
  }
  return {dq, dk, dv, db};
}

void through_fallback(const c10::OperatorHandle& op, Stack* stack) {
  run(op, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(fused_attention));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(fused_attention_backward));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&through_fallback>());
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         torch::CppFunction::makeFromBoxedFunction<&through_fallback>());
}

}  // namespace neuron_lab

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron_lab::fused_sdp_choice);
}  // namespace at::native
