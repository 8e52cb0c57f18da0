// The PrivateUse1 hooks of the emulated `neuron` backend (devices, generators, pinned memory, storage resize) and
// its device allocator, registered at load as a C++ backend registers them.
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>

namespace neuron_lab {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    if (d >= 0 && d < device_count()) set_device_unchecked(d);
    return old;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override { allocator().resize(storage, n); }
};

struct Registration {
  Registration() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator());
  }
};
Registration registration;

}  // namespace
}  // namespace neuron_lab
