// Random numbers on the emulated devices: one default generator per device, each around a CPU engine.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace neuron_lab {

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU engine behind a `neuron` generator: CPU kernels draw from it, so a seed gives the CPU's stream.
at::Generator cpu_engine(const at::Generator& gen);

}  // namespace neuron_lab
