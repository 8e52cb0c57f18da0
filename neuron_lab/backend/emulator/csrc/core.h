// The compiled core of the emulated `neuron` device: declarations shared by its translation units.
//
// Device memory is host memory presented as PrivateUse1 storages; the allocator models TorchNeuron's
// caching allocator in its statistics (segments, pools, retries) while returning freed bytes to the
// host at once. Ops run on zero-copy CPU aliases (dispatch.cpp); Python is called only for the ops a
// subscriber or the coverage profile needs to hear about.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace neuron_lab {

constexpr int kMaxDevices = 127;  // PyTorch's DeviceIndex is an int8_t

// -- devices (device.cpp) ------------------------------------------------------------------
void configure_devices(const std::vector<int64_t>& capacities);
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
// -1 means the current device; anything else outside [0, count) is PyTorch's "invalid device" error.
c10::DeviceIndex checked_index(int64_t index);

const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU engine behind a `neuron` generator: CPU kernels draw from it, so a seed gives the CPU's stream.
at::Generator cpu_engine(const at::Generator& gen);

// -- memory (allocator.cpp) ----------------------------------------------------------------
// A stack captured for memory history (a torch::CapturedTraceback, symbolized only when a snapshot is taken).
using Context = std::shared_ptr<c10::GatheredContext>;

// A segment of the emulated device's address space: a virtual range the allocator owns, not host memory. A
// cached segment keeps its address, so a snapshot shows when the cache hands the same segment out again.
struct Segment {
  uint64_t addr = 0;
  size_t size = 0;  // the size class
  Context context;  // where it was first reserved, while history records stacks
};

// One action of the allocator, as CUDA's memory history records it.
struct TraceEntry {
  enum Action : uint8_t { kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kOom };
  Action action;
  uint64_t addr;  // the device's free bytes for kOom
  size_t size;
  int64_t time_us;
  Context context;
};

// A segment as a snapshot reports it: holding one live block (requested bytes > 0 or active) or cached.
struct SegmentState {
  c10::DeviceIndex device = 0;
  Segment segment;
  bool small = true, active = false;
  size_t requested = 0;
  Context block_context;
};

struct MemorySnapshot {
  std::vector<SegmentState> segments;  // by address
  std::vector<std::vector<TraceEntry>> traces;  // per device, oldest first
};

struct Block {
  c10::Storage host;  // the CPU storage that owns the bytes
  void* ptr = nullptr;
  size_t nbytes = 0;  // requested
  Segment segment;  // the size class it reserved, at its emulated device address
  Context context;  // where it was allocated, while history records stacks
  bool small = true;
  c10::DeviceIndex device = 0;
  int64_t created_ns = 0;
  int64_t serial = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  std::vector<std::string> site;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;  // the device storage, once known
};

struct DeviceMemory {
  int64_t capacity = 0;
  c10::CachingDeviceAllocator::DeviceStats stats;
  std::map<size_t, std::vector<Segment>> cached_small, cached_large;  // size class -> cached segments, newest last
  int64_t cached_bytes = 0;
  uint64_t next_addr = 0;  // the emulated address space: segments are carved from here and never move
  std::unordered_set<Block*> live;
  std::vector<TraceEntry> trace;  // a ring of the last max_entries actions while history records
  size_t trace_next = 0;
};

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  void configure(const std::vector<int64_t>& capacities);
  c10::DataPtr allocate_on(size_t n, c10::DeviceIndex device);
  // Present a CPU kernel's result storage as device memory, without copying.
  c10::DataPtr adopt(const c10::Storage& host, c10::DeviceIndex device);
  void resize(const c10::Storage& storage, size_t n);  // in place: the StorageImpl stays, its bytes move
  void release(Block* b);
  void empty_cache(c10::DeviceIndex device);
  int64_t capacity(c10::DeviceIndex device);
  static Block* block_of(const c10::DataPtr& p);
  static void describe(const at::Tensor& t);  // dtype and shape of a fresh allocation, for the live list
  // The live device storage whose bytes start at `ptr`, if the core knows it.
  c10::intrusive_ptr<c10::StorageImpl> storage_at(const void* ptr);

  int64_t open_window();
  int64_t close_window(int64_t window);
  int64_t total_allocated();
  std::vector<Block> live_blocks();  // copies, oldest first
  bool record_sites = false;

  // Memory history, as torch.cuda.memory._record_memory_history: `context` is 0 (no stacks), 1 (stacks of live
  // blocks), 2 (and of allocations in the trace) or 3 (and of frees). Disabling, or `clear`, empties the trace.
  void record_history(bool enabled, int context, size_t max_entries, bool clear);
  MemorySnapshot snapshot();

 private:
  Segment reserve(size_t n, c10::DeviceIndex device, bool* small, const Context& ctx);
  c10::DataPtr register_block(c10::Storage host, size_t n, Segment segment, bool small, c10::DeviceIndex device,
                              Context ctx);
  void cache(DeviceMemory& d, Segment segment, bool small);  // a freed segment stays reserved, reusable
  void release_cached(DeviceMemory& d, c10::DeviceIndex device);
  Context gather(int level) const;  // the caller's stack if history records stacks at `level`, else null
  void record(DeviceMemory& d, TraceEntry::Action action, uint64_t addr, size_t size, const Context& ctx);
  std::atomic<bool> history_{false};  // the hot path's only cost while history is off: one relaxed load
  std::atomic<int> context_{0};
  size_t max_entries_ = 0;
  std::mutex mu_;
  std::vector<DeviceMemory> devices_;
  std::unordered_map<const void*, Block*> by_ptr_;
  std::map<int64_t, int64_t> windows_;  // open peak windows: id -> highest total allocated since
  int64_t next_window_ = 0, next_serial_ = 0, total_ = 0;
};

NeuronAllocator& allocator();
c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* data);

// -- the rules both cores share (policy.py), handed over once by set_policy (module.cpp) -------------
struct Policy {
  // Op names (aten::...) that take a quirk: CPU index tensors allowed, integer inputs computed in float32, the
  // input gradient always computed, drawing from the default CPU generator, the CPU kernel run on the device tensor.
  std::unordered_set<std::string> mixed_ok, int_as_float, always_grad_input, implicit_rng, on_device;
  uint64_t wide_mask = 0;  // dtypes (one bit per ScalarType) TorchNeuron computes in 32 bits
  std::unordered_map<uint64_t, std::string> downcast_reasons;  // the wide dtypes of a call -> its downcast reason
  std::string device_mismatch;  // with {first}, {second}, {op}
  std::string unsupported_layout;  // with {layout}
};
void set_policy(Policy policy);
// A message template with its {name} placeholders filled in.
std::string fill(std::string text, std::initializer_list<std::pair<const char*, std::string>> values);

// -- ops (dispatch.cpp) --------------------------------------------------------------------
// Kinds of op call are named by Python (neuron_lab.kinds) at configure time; the core itself makes only the
// first two, and numbers the others in the order it was given.
enum Kind : int { kNative = 0, kDowncast = 1, kMaxKinds = 8 };

struct Signature {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> dtypes;
  bool operator==(const Signature& o) const { return shapes == o.shapes && dtypes == o.dtypes; }
};

struct OpStat {
  int64_t count = 0;
  int64_t host_ns = 0;
  std::string reason;
  std::vector<Signature> signatures;
};

struct OpRow {  // one (op, kind) aggregate, as Python reads it
  std::string name, overload, reason;
  int kind;
  int64_t count, host_ns;
  std::vector<Signature> signatures;
};

// Zero-copy bridges for code that computes on the host itself (compiled graphs).
at::Tensor host_alias(const at::Tensor& t);
at::Tensor from_host(const at::Tensor& r, c10::DeviceIndex device);

// Route these overloads to the fallback directly: one call instead of a composite's empty + `.out` pair, or
// instead of a composite that differs from the CPU kernel.
void register_direct(const std::vector<std::string>& names);

std::vector<OpRow> op_rows();
void clear_op_rows();
void forget_kinds();  // the coverage profile changed
void set_wanted(int kinds_mask);
void set_emulate_downcast(bool on);
int64_t op_calls();
std::vector<int64_t> transfers();  // h2d, d2h since the last clear; then the same since the start

// -- torch.profiler (profiler.cpp) ------------------------------------------------------------
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

// -- Python, called from C++ (module.cpp): each takes the GIL and turns a Python exception into a
// C++ exception that PyTorch re-raises unchanged in Python (KeyboardInterrupt included).
std::pair<int, std::string> classify(const std::string& name, const std::vector<std::string>& dtypes);
// `key` names the op (its plan): the Python strings and the last signature's tuples are made once per key.
void deliver(const void* key, const std::string& name, const std::string& overload, int kind,
             const std::string& reason, const Signature& sig, int64_t host_ns, const std::vector<c10::IValue>& args);
std::vector<std::string> allocation_site();

}  // namespace neuron_lab
