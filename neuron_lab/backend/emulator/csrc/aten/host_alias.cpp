// Zero-copy views between device and host storages.
#include "aten/host_alias.h"

#include "runtime/allocator.h"
#include "runtime/device.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

namespace neuron_lab {
namespace {

at::Tensor with_math_bits(at::Tensor t, const at::Tensor& like) {
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

// Setting sizes and strides makes TensorImpl derive its contiguity flags again (refresh_contiguous: a few hundred
// instructions and mispredicted branches a tensor, for every result and every restrided alias). A tensor of the
// same layout has them already: copy_generic_tensor_metadata copies sizes, strides, offset, numel and those flags
// (and dtype and device: dst keeps its own device; both are of one dtype), never storage, keys or version. Where it
// would carry more (names, symbolic sizes, a wrapped number's mark) or the sizes are not the plain ones (a custom
// sizes or strides policy), the layout is set as before.
struct Layout final : c10::TensorImpl {
  static void copy(c10::TensorImpl& dst, const c10::TensorImpl& src) {
    constexpr auto extra = &Layout::extra_meta_;  // pointers to protected members, formed through the subclass
    constexpr auto device = &Layout::device_opt_;
    constexpr auto custom = &Layout::matches_policy;
    constexpr auto kCustom = SizesStridesPolicy::CustomStrides;
    if (src.*extra || dst.*extra || (src.*custom)(kCustom) || (dst.*custom)(kCustom) ||
        src.has_symbolic_sizes_strides() || src.is_wrapped_number() || dst.is_wrapped_number() ||
        dst.dtype() != src.dtype()) {
      dst.set_sizes_and_strides(src.sizes(), src.strides(), src.storage_offset());
      return;
    }
    const std::optional<c10::Device> own = dst.*device;
    copy_generic_tensor_metadata(&src, &dst);
    dst.*device = own;
  }
};

}  // namespace

at::Tensor over(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  Layout::copy(*t.unsafeGetTensorImpl(), *like.unsafeGetTensorImpl());
  return with_math_bits(std::move(t), like);
}

// A CPU storage over a device storage's bytes. A growable one is what an out= argument gets: a kernel that
// resizes it moves it to fresh host memory, and the device storage then grows in place to match.
c10::Storage cpu_alias_storage(const c10::Storage& device, bool growable) {
  if (!growable) {  // the block's own host storage already is one over these bytes: no new StorageImpl per op
    const Block* b = NeuronAllocator::block_of(device.data_ptr());
    if (b && b->ptr == device.data() && b->host_nbytes == device.nbytes()) return b->host;
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), device.nbytes(),
      c10::DataPtr(const_cast<void*>(device.data()), c10::Device(c10::DeviceType::CPU)),
      growable ? c10::GetCPUAllocator() : nullptr, growable));
}

namespace {

// Whether `a` may be the block's cached alias: a plain CPU tensor (no math bits, no autograd, no wrapped number)
// over the block's own host storage.
bool plain_alias(const at::Tensor& a, const Block& b) {
  const c10::TensorImpl* impl = a.unsafeGetTensorImpl();
  return impl->storage().unsafeGetStorageImpl() == b.host.unsafeGetStorageImpl() && impl->autograd_meta() == nullptr &&
         !impl->is_wrapped_number() && !a.is_conj() && !a.is_neg();
}

// Whether a block's cached alias still is `t`'s: a plain alias in t's dtype and layout. A kernel may have changed its
// layout since.
// Element by element, inline: ArrayRef's == calls memcmp twice, and this runs for every argument of every op.
bool same_layout(const c10::TensorImpl& a, const c10::TensorImpl& t) {
  const size_t n = a.dim();
  if (n != static_cast<size_t>(t.dim()) || a.storage_offset() != t.storage_offset()) return false;
  const int64_t *as = a.sizes().data(), *ts = t.sizes().data(), *ad = a.strides().data(), *td = t.strides().data();
  for (size_t i = 0; i < n; ++i) {
    if (as[i] != ts[i] || ad[i] != td[i]) return false;
  }
  return true;
}

bool fits(const at::Tensor& a, const Block& b, const at::Tensor& t) {
  return a.defined() && plain_alias(a, b) && a.dtype() == t.dtype() &&
         same_layout(*a.unsafeGetTensorImpl(), *t.unsafeGetTensorImpl());
}

// The block's cached alias for `t` (made and kept if it had none that fits); undefined if another thread holds it.
// One that nobody else holds (no kernel computing on it, no earlier argument of the same call) takes t's layout in
// place: a view's call after the whole tensor's (a transposed weight, a slice) makes and frees no TensorImpl.
at::Tensor cached(Block& b, const at::Tensor& t) {
  if (b.alias.busy.exchange(true, std::memory_order_acquire)) return {};
  at::Tensor& a = b.alias.tensor;
  if (!fits(a, b, t)) {
    if (a.defined() && a.use_count() == 1 && plain_alias(a, b) && a.dtype() == t.dtype()) {
      Layout::copy(*a.unsafeGetTensorImpl(), *t.unsafeGetTensorImpl());
    } else {
      a = over(b.host, kCPU, t);
    }
  }
  at::Tensor out = a;
  b.alias.busy.store(false, std::memory_order_release);
  return out;
}

}  // namespace

// The non-resizable CPU alias a kernel computes on: same bytes, same layout. A device tensor without math bits over a
// whole block takes the block's cached one.
at::Tensor host(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
  const c10::Storage& st = t.storage();
  Block* b = NeuronAllocator::block_of(st.data_ptr());
  if (b && !t.is_conj() && !t.is_neg() && b->ptr == st.data() && b->host_nbytes == st.nbytes()) {
    if (at::Tensor a = cached(*b, t); a.defined()) return a;
  }
  return over(cpu_alias_storage(st), kCPU, t);
}

at::Tensor on_device(c10::Storage storage, const at::Tensor& like) {
  return over(std::move(storage), kDevice, like);
}

// A device storage over a CPU kernel's result bytes (no copy).
c10::Storage adopt(const at::Tensor& r, c10::DeviceIndex device) {
  auto ptr = allocator().adopt(r.storage(), device);
  Block* b = NeuronAllocator::block_of(ptr);
  c10::Storage st(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), r.storage().nbytes(),
                                                        std::move(ptr), &allocator(), true));
  if (b) {
    b->dtype = r.scalar_type();
    b->shape.assign(r.sizes().begin(), r.sizes().end());  // a recycled block keeps its vector's room
    b->storage = c10::weak_intrusive_ptr<c10::StorageImpl>(st.getWeakStorageImpl());
  }
  return st;
}

at::Tensor host_alias(const at::Tensor& t) {  // Python may keep it or change it: never a block's cached one
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
  return over(cpu_alias_storage(t.storage()), kCPU, t);
}

at::Tensor presented(at::Tensor r, c10::DeviceIndex device) {
  if (r.device().type() == c10::DeviceType::PrivateUse1) return r;  // made in device memory already (pooled)
  c10::Storage st = adopt(r, device);
  Block* b = NeuronAllocator::block_of(st.data_ptr());
  at::Tensor out = on_device(std::move(st), r);
  // A fresh block: no other thread knows it yet. Moved, not copied: no reference count to take and give back.
  if (b && r.is_cpu() && plain_alias(r, *b)) b->alias.tensor = std::move(r);
  return out;
}

Pooled pooled(c10::DeviceIndex device, caffe2::TypeMeta dtype, size_t nbytes,
              std::optional<c10::IntArrayRef> contiguous) {
  c10::DataPtr ptr = allocator().allocate_on(nbytes, device);
  Block* b = NeuronAllocator::block_of(ptr);
  c10::Storage st(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(ptr),
                                                        &allocator(), true));
  // A fresh block: no other thread knows it yet. A spare one's alias is plain over its bytes (reusable()).
  at::Tensor& a = b->alias.tensor;
  if (!a.defined() || a.dtype() != dtype) a = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(b->host), kCPU, dtype);
  if (contiguous) {
    a.unsafeGetTensorImpl()->set_storage_offset(0);  // a cached alias may have been a view's
    a.unsafeGetTensorImpl()->set_sizes_contiguous(*contiguous);
  } else {
    const int64_t none[] = {0}, unit[] = {1};
    a.unsafeGetTensorImpl()->set_sizes_and_strides(none, unit, 0);
  }
  return {std::move(st), &a};
}

at::Tensor settled(Pooled p) {
  at::Tensor out = on_device(std::move(p.storage), *p.host);
  NeuronAllocator::describe(out);  // its dtype, shape and storage, as adopt() gives an adopted result
  return out;
}

at::Tensor from_host(const at::Tensor& r, c10::DeviceIndex device) {
  if (!r.defined() || r.device().type() == c10::DeviceType::PrivateUse1) return r;
  if (auto st = allocator().storage_at(r.storage().data())) return on_device(c10::Storage(std::move(st)), r);
  return on_device(adopt(r, checked_index(device)), r);
}

}  // namespace neuron_lab
