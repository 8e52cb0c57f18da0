// The rules both emulator cores share (neuron_lab/backend/emulator/policy.py): op quirk tables, the 64-bit
// downcast, message templates. Python hands them over once, at configure (set_policy in dispatch.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace neuron_lab {

struct Policy {
  // Op names (aten::...) that take a quirk: CPU index tensors allowed, integer inputs computed in float32, the
  // input gradient always computed, drawing from the default CPU generator, the CPU kernel run on the device tensor.
  std::unordered_set<std::string> mixed_ok, int_as_float, always_grad_input, implicit_rng, on_device;
  // aten::op.argument names a CPU kernel writes though the schema does not say so (native_batch_norm's running stats).
  std::unordered_set<std::string> undeclared_writes;
  // Ops whose result's shape depends on the data (nonzero, unique): on a device, a read back to the host.
  std::unordered_set<std::string> data_dependent;
  // Ops whose TorchNeuron kernels keep int64 under the 64-bit rule (copies, clone, plumbing).
  std::unordered_set<std::string> keeps_int64;
  uint64_t off_device_kinds = 0;  // kinds (one bit per index) of calls computed on the CPU: int64 stays exact
  uint64_t host_mask = 0;  // dtypes TorchNeuron computes on the CPU: a call holding one is not downcast
  uint64_t wide_mask = 0;  // dtypes (one bit per ScalarType) TorchNeuron computes in 32 bits
  std::unordered_map<uint64_t, std::string> downcast_reasons;  // the wide dtypes of a call -> its downcast reason
  std::string device_mismatch;  // with {first}, {second}, {op}
  std::string unsupported_layout;  // with {layout}
};
// A message template with its {name} placeholders filled in.
std::string fill(std::string text, std::initializer_list<std::pair<const char*, std::string>> values);

}  // namespace neuron_lab
