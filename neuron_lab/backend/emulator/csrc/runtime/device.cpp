// The emulated `neuron` devices: their count (one per configured capacity) and the current one per thread.
#include "runtime/device.h"

#include "runtime/allocator.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace neuron_lab {
namespace {

std::atomic<int> n_devices{1};
thread_local c10::DeviceIndex current = 0;

}  // namespace

void configure_devices(const std::vector<int64_t>& capacities) {
  TORCH_CHECK(!capacities.empty() && capacities.size() <= kMaxDevices, "neuron emulator: between 1 and ",
              kMaxDevices, " devices, got ", capacities.size());
  allocator().configure(capacities);
  n_devices = static_cast<int>(capacities.size());
}

c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(n_devices.load());
}

c10::DeviceIndex current_device() {
  return current;
}

c10::DeviceIndex checked_index(int64_t index) {
  if (index == -1) return current;
  TORCH_CHECK(index >= 0 && index < device_count(), "Invalid device id ", index, ": neuron has ",
                    static_cast<int>(device_count()), " device(s) (neuron:0..neuron:", device_count() - 1,
                    "); see NEURON_RT_VISIBLE_CORES and NEURON_LAB_INSTANCE");
  return static_cast<c10::DeviceIndex>(index);
}

void set_device(c10::DeviceIndex index) {
  current = checked_index(index);
}

void set_device_unchecked(c10::DeviceIndex index) noexcept {
  current = index;
}

}  // namespace neuron_lab
