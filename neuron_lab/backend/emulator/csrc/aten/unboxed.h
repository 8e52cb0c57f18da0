// Typed kernels for the hottest ops, the in-place `_foreach_` ones included (unboxed.cpp says how).
#pragma once

#include <torch/library.h>

#include <string>

namespace neuron_lab {

// Registers `name`'s typed kernel on `lib` if it has one; false if not (the boxed fallback then takes it).
bool register_typed(torch::Library& lib, const std::string& name);

}  // namespace neuron_lab
