// The emulated devices in torch.profiler: device lanes for op calls, copies and collectives (profiler.cpp says how).
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace neuron_lab {

// Set while a profiler wants device time: an op checks it once and times itself only then.
extern std::atomic<bool> g_profiling;
inline bool profiling() { return g_profiling.load(std::memory_order_relaxed); }
int64_t profile_clock();  // Unix epoch ns, the clock of Kineto's CPU ops
// One op call on `device` from start to end: a kernel on the device's lane, or host work for off-device kinds.
void trace_kernel(const std::string& name, c10::DeviceIndex device, int kind, int64_t start_ns, int64_t end_ns);
void trace_copy(bool to_device, bool from_device, c10::DeviceIndex device, int64_t bytes, int64_t start_ns,
                int64_t end_ns);
bool tracing();  // a Kineto session records the device now (the legacy stubs' timing does not count)
// A collective's call to completion on `device` (a rank's waiting for its peers included), a kernel on the device's
// lane as NCCL's are on CUDA's; nothing unless a Kineto session records.
void trace_collective(const std::string& name, c10::DeviceIndex device, int64_t bytes, int64_t start_ns,
                      int64_t end_ns);
// Kind names by index, and for kinds that run on the host the label their calls get ("CPU fallback"), else "".
void set_trace_kinds(const std::vector<std::string>& names, const std::vector<std::string>& labels);
bool profiler_registered();  // both of PyTorch's PrivateUse1 profiler hooks are ours

}  // namespace neuron_lab
