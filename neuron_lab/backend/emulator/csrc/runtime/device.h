// The emulated `neuron` devices: how many there are, and which one is current on this thread.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace neuron_lab {

constexpr int kMaxDevices = 127;  // PyTorch's DeviceIndex is an int8_t

// One device per capacity (bytes); the allocator is configured with them.
void configure_devices(const std::vector<int64_t>& capacities);
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
void set_device_unchecked(c10::DeviceIndex index) noexcept;  // the guard's uncheckedSetDevice
// -1 means the current device; anything else outside [0, count) is PyTorch's "invalid device" error.
c10::DeviceIndex checked_index(int64_t index);

}  // namespace neuron_lab
