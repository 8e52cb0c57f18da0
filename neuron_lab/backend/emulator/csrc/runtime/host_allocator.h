// Pinned host memory for the emulated `neuron` devices: CPU bytes the hooks report as pinned.
#pragma once

#include <c10/core/Allocator.h>

namespace neuron_lab {

c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* data);

}  // namespace neuron_lab
