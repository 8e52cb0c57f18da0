// Typed kernels for the hottest ops, the in-place `_foreach_` ones included (unboxed.cpp says how).
#pragma once

#include <torch/library.h>

#include <string>
#include <vector>

namespace neuron_lab {

// Registers `name`'s typed kernel on `lib` if it has one; false if not (the boxed fallback then takes it).
bool register_typed(torch::Library& lib, const std::string& name);
// The overloads that have a typed kernel (bench/step_ops.py names each op's path with them).
std::vector<std::string> typed_names();

}  // namespace neuron_lab
