// Zero-copy views between device and host: the CPU tensors a host kernel computes on, over a device storage's
// bytes, and device tensors over a CPU result's bytes.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace neuron_lab {

inline const c10::DispatchKeySet kCPU(c10::DispatchKey::CPU);
inline const c10::DispatchKeySet kDevice(c10::DispatchKey::PrivateUse1);

at::Tensor over(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like);
// A CPU storage over a device storage's bytes. A growable one is what an out= argument gets: a kernel that
// resizes it moves it to fresh host memory, and the device storage then grows in place to match.
c10::Storage cpu_alias_storage(const c10::Storage& device, bool growable = false);
// The non-resizable CPU alias a kernel computes on: same bytes, same layout.
at::Tensor host(const at::Tensor& t);
at::Tensor on_device(c10::Storage storage, const at::Tensor& like);
// A device storage over a CPU kernel's result bytes (no copy).
c10::Storage adopt(const at::Tensor& r, c10::DeviceIndex device);
// A typed kernel's CPU result as a device tensor over its bytes; the result itself becomes the block's host alias
// (pass it moved when the caller is done with it).
at::Tensor presented(at::Tensor r, c10::DeviceIndex device);

// A typed kernel's result made in device memory first: `nbytes` on `device` (a freed small-pool block's bytes
// when one is spare) and `host`, the block's cached CPU alias in `dtype` with no elements, for a `.out` kernel to
// write. An out= with no elements takes the result's sizes and strides from the inputs, as the functional kernel's
// result does, so no CPU result is allocated, adopted and freed.
struct Pooled {
  c10::Storage storage;
  at::Tensor* host;
};
// `contiguous`: the alias takes these sizes, contiguous, at once instead (the kernel finds its out sized).
Pooled pooled(c10::DeviceIndex device, caffe2::TypeMeta dtype, size_t nbytes,
              std::optional<c10::IntArrayRef> contiguous = std::nullopt);
// The device tensor over p's bytes, in the layout the kernel gave p.host (which stays the block's cached alias).
at::Tensor settled(Pooled p);

// Zero-copy bridges for code that computes on the host itself (compiled graphs).
at::Tensor host_alias(const at::Tensor& t);
at::Tensor from_host(const at::Tensor& r, c10::DeviceIndex device);

}  // namespace neuron_lab
