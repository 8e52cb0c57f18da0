// Scaled dot-product attention as TorchNeuron runs it (SdpBackendSelection.cpp): the same choice registered for
// PrivateUse1, and the fused overrideable op and its backward, whose composite kernels raise. Their host kernels
// are CPU kernels the boxed fallback runs on host aliases, so each call is reported as itself, with its call site
// and the coverage's kind. The pure-Python core computes the same way (neuron_lab/backend/emulator/attention.py
// says how: the CPU's flash kernels without dropout where they accept the arguments, else the math kernel's arithmetic;
// dropout's mask drawn from the default CPU generator as the CPU's math kernel draws it, philox_seed its state), but
// for one thing: this core keeps the math arithmetic's softmax and mask for the backward (Kept, below).
#include "aten/dispatch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

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
         q.size(1) % k.size(1) == 0 && k.size(1) == v.size(1) && k.size(-1) == d && v.size(-1) == d &&
         (!bias.defined() || ((bias.dim() == 2 || bias.dim() == 4) && bias.scalar_type() == q.scalar_type()));
}

// Key or value repeated to the query's heads; itself when they are equal (a copy would round differently).
at::Tensor repeated(const at::Tensor& t, int64_t g) {
  return g > 1 ? t.repeat_interleave(g, 1) : t;
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
}

// A 4-D matmul's operands as it hands them to bmm (reshaped, so copied where not viewable): its backward multiplies
// these, so computing on them keeps autograd's rounding.
std::pair<at::Tensor, at::Tensor> bmm_operands(const at::Tensor& a, const at::Tensor& b) {
  return {a.reshape({-1, a.size(-2), a.size(-1)}), b.reshape({-1, b.size(-2), b.size(-1)})};
}

// bmm's two gradients, as its autograd formula computes them, for bmm_operands' a and b.
std::pair<at::Tensor, at::Tensor> bmm_backward(const at::Tensor& grad, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor g = grad.reshape({a.size(0), a.size(1), b.size(2)});
  return {g.bmm(b.transpose(1, 2)), a.transpose(1, 2).bmm(g)};
}

// PyTorch's math kernel step by step, so with its rounding (attention.py's _math says how): inputs in the
// accumulation dtype, key repeated to the query's heads.
struct Math {
  at::Tensor qs, kt;  // the query and the transposed key, each times sqrt(scale), as bmm took them
  at::Tensor p, lse;
  at::Tensor noise;  // dropout's: kept entries (1 - p) ** -1, else 0; undefined without dropout
};

double root(double scale) {
  return std::sqrt(std::abs(scale));
}

double query_factor(double scale) {
  return scale < 0 ? -root(scale) : root(scale);
}

// `state`: the generator state to draw dropout's mask from (a call's philox_seed); undefined: the default CPU generator.
// `with_lse`: the forward returns the logsumexp; the backward's recomputation has no use for it.
Math math(const at::Tensor& q, const at::Tensor& k, at::Tensor bias, double dropout_p, bool is_causal, double scale,
          const at::Tensor& state, bool with_lse) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  Math m;
  std::tie(m.qs, m.kt) = bmm_operands(q * query_factor(scale), k.transpose(-2, -1) * root(scale));
  std::vector<int64_t> shape = q.sizes().vec();
  shape.back() = k.size(-2);
  at::Tensor s = m.qs.bmm(m.kt).view(shape);
  if (is_causal) bias = at::ones({s.size(-2), s.size(-1)}, at::kBool).tril();
  if (bias.defined()) {
    s = s + (bias.scalar_type() == at::kBool
                 ? at::zeros_like(bias, s.options()).masked_fill(bias.logical_not(), -inf)
                 : bias.to(s.scalar_type()));
  }
  m.p = at::_safe_softmax(s, -1);
  if (with_lse) m.lse = at::logsumexp(s, {-1});
  if (dropout_p > 0.0) {
    std::optional<at::Generator> gen;
    if (state.defined()) {
      gen = at::make_generator<at::CPUGeneratorImpl>();
      gen->set_state(state);
    }
    // drawn in the probabilities' dtype, as the CPU's dropout draws its noise (the draws do not depend on the dtype)
    m.noise = at::empty(m.p.sizes(), m.p.options()).bernoulli_(1.0 - dropout_p, gen);
    if (dropout_p >= 1.0) {
      m.noise.zero_();
    } else {
      m.noise.div_(1.0 - dropout_p);
    }
  }
  return m;
}

// A call's query, key, value and bias, by their bytes: a backward called with other inputs finds nothing kept.
using Inputs = std::array<const void*, 4>;

Inputs inputs_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias) {
  return {q.data_ptr(), k.data_ptr(), v.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr};
}

// What a forward's math computed, kept for its backward: CPU eager's math kernel keeps the same tensors for autograd,
// and without them the backward computes the scores, softmax and dropout's mask again (a third of a dropout
// transformer's step's extra work on `neuron`). Kept by the forward's logsumexp's host storage, held here, so that its
// bytes cannot be another call's while the entry lives. An entry goes once its backward took it, or once nothing but
// this holds that storage (the graph died without a backward: swept at the next forward's keep); a backward that
// finds none computes them again, as TorchNeuron's fused kernel does, to the same bits.
struct Kept {
  c10::Storage lse;
  Inputs inputs;
  std::vector<int64_t> q_sizes, k_sizes;
  double dropout_p, scale;
  bool is_causal;
  Math m;
  at::Tensor dropped;  // the probabilities after dropout, as the output's matmul took them
  size_t nbytes;
};

class KeptForBackward {
 public:
  static constexpr size_t kLimit = size_t{1} << 30;  // host bytes held at most; past it a backward recomputes

  void keep(Kept k) {
    std::lock_guard<std::mutex> g(mu_);
    sweep();
    if (held_ + k.nbytes > kLimit) return;
    held_ += k.nbytes;
    entries_.push_back(std::move(k));
  }

  std::optional<Kept> take(const at::Tensor& lse, const Inputs& inputs, c10::IntArrayRef q_sizes,
                           c10::IntArrayRef k_sizes, double dropout_p, bool is_causal, double scale) {
    std::lock_guard<std::mutex> g(mu_);
    const c10::StorageImpl* st = lse.storage().unsafeGetStorageImpl();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->lse.unsafeGetStorageImpl() != st) continue;
      std::optional<Kept> out;
      if (it->inputs == inputs && c10::IntArrayRef(it->q_sizes) == q_sizes && c10::IntArrayRef(it->k_sizes) == k_sizes &&
          it->dropout_p == dropout_p && it->is_causal == is_causal && it->scale == scale) {
        out = std::move(*it);
      }
      held_ -= it->nbytes;
      entries_.erase(it);
      return out;
    }
    return std::nullopt;
  }

 private:
  void sweep() {  // under mu_: the entries whose graph died
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->lse.use_count() == 1) {
        held_ -= it->nbytes;
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::mutex mu_;
  std::vector<Kept> entries_;
  size_t held_ = 0;
};

KeptForBackward& kept_for_backward() {
  static auto* k = new KeptForBackward();  // never destroyed: tensors must not be freed after torch unloads
  return *k;
}

size_t bytes_of(std::initializer_list<const at::Tensor*> ts) {
  size_t n = 0;
  for (const at::Tensor* t : ts) {
    if (t->defined()) n += t->nbytes();
  }
  return n;
}

// The output in the layout the op's meta function gives it (alloc_with_matching_layout: the query's dimension order):
// a compiled graph's views of it were traced on that layout.
at::Tensor laid_out_as_meta(const at::Tensor& out, const at::Tensor& query) {
  at::Tensor want;
  if (query.sizes() == out.sizes()) {
    want = at::empty_like(query.transpose(1, 2), out.options()).transpose(1, 2);
  } else {
    std::vector<int64_t> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return query.stride(a) > query.stride(b); });
    std::vector<int64_t> permuted, back(4);
    for (int64_t i = 0; i < 4; ++i) {
      permuted.push_back(out.size(order[i]));
      back[order[i]] = i;
    }
    want = at::empty(permuted, out.options()).permute(back);
  }
  return want.strides() == out.strides() ? out : want.copy_(out);
}

// A gradient in its input's layout, as the backward's meta function gives it (empty_like).
at::Tensor in_layout_of(const at::Tensor& grad, const at::Tensor& input) {
  at::Tensor want = at::empty_like(input);
  return want.strides() == grad.strides() ? grad : want.copy_(grad);
}

// The default CPU generator's state, as torch.get_rng_state() reads it.
at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::scoped_lock<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Contiguous and in float, as the meta function gives it (the CPU's flash lays it out (B, S, H)); float64 keeps its own
// (exact 64-bit numerics: backward needs every bit).
at::Tensor as_meta_lse(const at::Tensor& lse, const at::Tensor& q) {
  return (q.scalar_type() == at::kDouble ? lse : lse.to(at::kFloat)).contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
fused_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const Opt& attn_bias,
                double dropout_p, bool is_causal, bool /*return_debug_mask*/, std::optional<double> scale) {
  at::Tensor q = batched(query), k = batched(key), v = batched(value), bias = batched(attn_bias.value_or(at::Tensor()));
  const double sc = scale_of(q, scale);
  at::Tensor state = dropout_p > 0.0 ? cpu_rng_state() : at::empty({0}, at::kByte);
  at::Tensor out, lse;
  if (flash(q, k, v, bias, dropout_p)) {
    std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal,
                                                                          bias.defined() ? Opt(bias) : std::nullopt, sc);
    lse = as_meta_lse(lse, q);
  } else {
    const int64_t g = q.size(1) / k.size(1);
    at::Tensor va = acc(repeated(v, g));
    Math m = math(acc(q), acc(repeated(k, g)), acc(bias), dropout_p, is_causal, sc, at::Tensor(), true);
    at::Tensor dropped = m.noise.defined() ? m.p * m.noise : m.p;
    out = at::matmul(dropped, va).to(q.scalar_type());
    // contiguous and in float, as the meta function gives it; float64 keeps its own (exact 64-bit numerics)
    lse = as_meta_lse(m.lse, q);
    if (at::GradMode::is_enabled()) {  // a backward may come (none does under no_grad)
      const size_t nbytes = bytes_of({&m.qs, &m.kt, &m.p, &m.noise, &dropped});
      kept_for_backward().keep({lse.storage(), inputs_of(q, k, v, bias), q.sizes().vec(),
                                k.sizes().vec(), dropout_p, sc, is_causal, std::move(m), std::move(dropped), nbytes});
    }
  }
  out = query.dim() == 3 ? out.squeeze(0) : laid_out_as_meta(out, query);
  return {out,
          lse,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(q.size(2)),
          c10::SymInt(k.size(2)),
          state,
          at::empty({0}, at::kInt),
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
    at::Tensor lse = logsumexp;
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        go, q, k, v, o, lse, 0.0, is_causal, bias.defined() ? Opt(bias) : std::nullopt, sc);
  } else {
    const int64_t g = q.size(1) / k.size(1);
    at::Tensor goa = acc(go), qa = acc(q), ka = acc(repeated(k, g)), va = acc(repeated(v, g));
    std::optional<Kept> kept = kept_for_backward().take(logsumexp, inputs_of(q, k, v, bias),
                                                        q.sizes(), k.sizes(), dropout_p, is_causal, sc);
    Math m = kept ? std::move(kept->m) : math(qa, ka, acc(bias), dropout_p, is_causal, sc, philox_seed, false);
    // what autograd computes through that math, op by op
    auto [pd, vb] = bmm_operands(kept ? kept->dropped : m.noise.defined() ? m.p * m.noise : m.p, va);
    at::Tensor dp;
    std::tie(dp, dv) = bmm_backward(goa, pd, vb);
    dp = dp.view(m.p.sizes());
    dv = dv.view(va.sizes());
    if (m.noise.defined()) dp = dp * m.noise;
    at::Tensor ds = at::_softmax_backward_data(dp, m.p, -1, m.p.scalar_type());
    std::tie(dq, dk) = bmm_backward(ds, m.qs, m.kt);
    dq = dq.view(qa.sizes()) * query_factor(sc);
    std::vector<int64_t> kt_shape = ka.sizes().vec();
    std::swap(kt_shape[kt_shape.size() - 1], kt_shape[kt_shape.size() - 2]);
    dk = (dk.view(kt_shape) * root(sc)).transpose(-2, -1);
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
  return {in_layout_of(dq, query), in_layout_of(dk, key), in_layout_of(dv, value), db};
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
