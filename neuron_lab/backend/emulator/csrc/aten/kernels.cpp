// The kernels a backend provides itself: allocation, copies (counted as transfers), views, resize, storage
// binding, scalars, and the convolutions a device must implement. Everything else reaches the boxed fallback.
#include "aten/dispatch.h"
#include "aten/host_alias.h"
#include "profiler/profiler.h"
#include "runtime/allocator.h"
#include "runtime/device.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace neuron_lab {
namespace {

// -- kernels a backend provides itself -------------------------------------------------------------
c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  return device && device->has_index() ? checked_index(device->index()) : current_device();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index_of(device)));
  at::Tensor t = at::detail::empty_generic(size, &allocator(), kDevice, c10::dtype_or_default(dtype), memory_format);
  NeuronAllocator::describe(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index_of(device)));
  at::Tensor t = at::detail::empty_strided_generic(size, stride, &allocator(), kDevice, c10::dtype_or_default(dtype));
  NeuronAllocator::describe(t);
  return t;
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  const bool traced = profiling();
  const int64_t w0 = traced ? profile_clock() : 0;
  {
    QuietHost quiet;
    host(self).copy_(host(src));
  }
  int64_t n = src.numel() * static_cast<int64_t>(src.element_size());
  if (traced) {
    trace_copy(!self.is_cpu(), !src.is_cpu(), (self.is_cpu() ? src : self).device().index(), n, w0, profile_clock());
  }
  if (src.is_cpu() != self.is_cpu()) count_transfer(src.is_cpu() ? n : 0, self.is_cpu() ? n : 0);
  static Plan& plan = named("aten::copy_", "");
  record(plan, kNative, "", 0, {&self, &src}, [&] { return Stack{self, src}; });
  if (self.is_cpu() && !src.is_cpu()) sync_point(plan, {self, src});
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  at::Tensor d = dst;
  copy_(d, self, false);
  return dst;
}

at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  c10::Device target = device.value_or(self.device());
  const bool traced = profiling();
  const int64_t w0 = traced ? profile_clock() : 0;
  QuietHost quiet;  // the host copy below is this op's own work
  at::Tensor h = host(self);
  at::Tensor r = at::_to_copy(h, dtype, layout, c10::Device(c10::kCPU), std::nullopt, non_blocking, memory_format);
  static Plan& plan = named("aten::_to_copy", "");
  record(plan, kNative, "", 0, {self});
  const int64_t n = r.numel() * static_cast<int64_t>(r.element_size());
  if (self.is_cpu()) count_transfer(n, 0);
  if (target.type() != c10::DeviceType::PrivateUse1) {
    count_transfer(0, n);
    if (!self.is_cpu()) sync_point(plan, {self});
    if (pin_memory.value_or(false)) r = r.pin_memory();
    if (traced) trace_copy(false, true, self.device().index(), n, w0, profile_clock());
    return r;
  }
  if (r.storage().data() == h.storage().data()) r = r.clone();
  auto idx = target.has_index() ? checked_index(target.index())
                                : (self.is_cpu() ? current_device() : self.device().index());
  if (traced) trace_copy(true, !self.is_cpu(), idx, n, w0, profile_clock());
  return on_device(adopt(r, idx), r);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  // As ATen's own resize_: a tensor already of that size keeps its strides unless a memory format is given.
  if (self.sizes() == size && !memory_format.has_value()) return self;
  // Grow the storage first: if that runs out of memory, the tensor is left as it was.
  auto mf = memory_format.value_or(c10::MemoryFormat::Contiguous);
  std::vector<int64_t> strides(size.size(), 1);
  for (int64_t i = static_cast<int64_t>(size.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<int64_t>(size[i + 1], 1);
  }
  if (mf == c10::MemoryFormat::ChannelsLast && size.size() == 4) strides = c10::get_channels_last_strides_2d(size);
  if (mf == c10::MemoryFormat::ChannelsLast3d && size.size() == 5) strides = c10::get_channels_last_strides_3d(size);
  size_t need = c10::multiply_integers(size) == 0
                    ? 0
                    : at::detail::computeStorageNbytes(size, strides, self.element_size(),
                                                       static_cast<size_t>(self.storage_offset()));
  if (need > self.storage().nbytes()) allocator().resize(self.storage(), need);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (mf != c10::MemoryFormat::Preserve && mf != c10::MemoryFormat::Contiguous) impl->empty_tensor_restride(mf);
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage st(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                        allocator().allocate_on(0, self.device().index()),
                                                        &allocator(), true));
  return self.set_(st, 0, {0}, {1});
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  count_transfer(0, static_cast<int64_t>(self.element_size()));
  static Plan& plan = named("aten::_local_scalar_dense", "");
  sync_point(plan, {self});
  const bool traced = profiling();
  const int64_t w0 = traced ? profile_clock() : 0;
  QuietHost quiet;
  auto v = at::_local_scalar_dense(host(self));
  if (traced) {
    trace_copy(false, true, self.device().index(), static_cast<int64_t>(self.element_size()), w0, profile_clock());
  }
  return v;
}

Stack through(const char* name, const char* overload, Stack args) {
  const auto& op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  Stack stack = std::move(args);
  run(op, &stack);
  return stack;
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  auto out = through("aten::convolution", "",
                     {input, weight, bias, stride.vec(), padding.vec(), dilation.vec(), transposed,
                      output_padding.vec(), groups});
  return out.back().toTensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  auto out = through("aten::convolution_backward", "",
                     {grad_output, input, weight, c10::IValue(), stride.vec(), padding.vec(), dilation.vec(),
                      transposed, output_padding.vec(), groups,
                      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})});
  auto get = [&](size_t i) { return out[out.size() - 3 + i].toTensor(); };
  return {get(0), get(1), get(2)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("copy_", TORCH_FN(copy_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_to_copy", TORCH_FN(to_copy));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

}  // namespace neuron_lab
