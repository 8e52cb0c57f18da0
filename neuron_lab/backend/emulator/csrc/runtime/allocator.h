// Device memory of the emulated `neuron` devices: host bytes presented as PrivateUse1 storages, with the
// statistics, segments and memory history of TorchNeuron's caching allocator (allocator.cpp says how).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuron_lab {

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

// The CPU tensor a typed kernel last computed on over a block's bytes (host_alias.cpp): the next op on a device
// tensor of the same layout takes it instead of a new TensorImpl. Not part of a block's description: copies and
// moves leave it behind. `busy` keeps two threads from taking it at once.
struct HostAlias {
  at::Tensor tensor;
  std::atomic<bool> busy{false};
  HostAlias() = default;
  HostAlias(const HostAlias&) {}
  HostAlias& operator=(const HostAlias&) { return *this; }
};

struct Block {
  c10::Storage host;  // the CPU storage that owns the bytes
  HostAlias alias;
  size_t capacity = 0;  // the host bytes' size when they are the allocator's own (a size class), else 0
  void* ptr = nullptr;  // host's bytes: they never move while the block lives (host is not resizable)
  size_t host_nbytes = 0;  // host's nbytes, read here so that host() need not reach host's StorageImpl
  size_t nbytes = 0;  // requested
  Segment segment;  // the size class it reserved, at its emulated device address
  Context context;  // where it was allocated, while history records stacks
  bool small = true;
  bool live = false;  // allocated, not a spare block kept for its bytes
  c10::DeviceIndex device = 0;
  int64_t created_ns = 0;  // OpClock::allocation_ns(): the time of the call that allocated it
  int64_t serial = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  std::vector<std::string> site;
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;  // the device storage, once known
};

// The small pool's size classes (allocator.cpp's size_class): 256 B, then four a power of two up to 1 MiB.
constexpr size_t kSmallClasses = 49;

struct DeviceMemory {
  int64_t capacity = 0;
  c10::CachingDeviceAllocator::DeviceStats stats;
  // Cached segments by size class, newest last: the small pool's by class index (ascending size), the large's by size.
  std::array<std::vector<Segment>, kSmallClasses> cached_small;
  std::map<size_t, std::vector<Segment>> cached_large;
  int64_t cached_bytes = 0;
  uint64_t next_addr = 0;  // the emulated address space: segments are carved from here and never move
  std::vector<TraceEntry> trace;  // a ring of the last max_entries actions while history records
  size_t trace_next = 0;
  // Freed small-pool blocks that keep their host bytes (a size class's worth) and cached CPU alias for the next
  // allocation of the class, by class index, newest last: host memory only, invisible to every statistic
  // (allocator.cpp says why).
  std::array<std::vector<Block*>, kSmallClasses> spare;
  int64_t spare_bytes = 0;
  // Open peak windows on the device, and the highest allocated bytes since a window last opened or closed on it:
  // an allocation updates one number, each window takes it when a window opens or closes (fold_windows).
  int windows = 0;
  int64_t window_high = 0;
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

  int64_t open_window(c10::DeviceIndex device);  // one device's peak allocated bytes from now on
  int64_t close_window(int64_t window);
  int64_t total_allocated();
  std::vector<Block> live_blocks();  // copies, oldest first
  bool record_sites = false;

  // Memory history, as torch.cuda.memory._record_memory_history: `context` is 0 (no stacks), 1 (stacks of live
  // blocks), 2 (and of allocations in the trace) or 3 (and of frees). Disabling, or `clear`, empties the trace.
  void record_history(bool enabled, int context, size_t max_entries, bool clear);
  MemorySnapshot snapshot();

 private:
  // What a block records of where and when it was allocated, taken before the lock (a stack takes the GIL).
  struct Origin {
    Context context;
    int64_t created_ns = 0;
    std::vector<std::string> site;
  };
  Origin origin();
  Segment reserve(size_t n, c10::DeviceIndex device, bool* small, const Context& ctx);
  // Without a segment, it reserves one under the same lock (an adopted result: its host bytes exist already).
  // A shell (or a new block) then holds `host`.
  c10::DataPtr register_block(c10::Storage host, size_t capacity, size_t n, std::optional<Segment> segment,
                              bool small, c10::DeviceIndex device, Origin origin);
  // Under the lock: `b`, which has its host bytes and segment, becomes live with n bytes (statistics, trace).
  // A spare block is already in by_ptr_ (its bytes did not move).
  c10::DataPtr enter(Block* b, size_t n, Origin origin, c10::DeviceIndex device, bool spare);
  void cache(DeviceMemory& d, Segment segment, bool small);  // a freed segment stays reserved, reusable
  void release_cached(DeviceMemory& d, c10::DeviceIndex device);
  Block* take_spare(DeviceMemory& d, size_t size_class);  // a freed small block with its host bytes, or null
  void drop_spare(DeviceMemory& d);  // their host bytes go back to the host
  Context gather(int level) const;  // the caller's stack if history records stacks at `level`, else null
  void record(DeviceMemory& d, TraceEntry::Action action, uint64_t addr, size_t size, const Context& ctx);
  void fold_windows(c10::DeviceIndex device);  // the device's open windows take its high mark; it starts afresh
  std::atomic<bool> history_{false};  // the hot path's only cost while history is off: one relaxed load
  std::atomic<int> context_{0};
  size_t max_entries_ = 0;
  std::mutex mu_;
  std::vector<DeviceMemory> devices_;
  ska::flat_hash_map<const void*, Block*> by_ptr_;  // every live and spare block, of every device
  std::vector<Block*> shells_;  // freed blocks without bytes, for the next adopted result
  std::map<int64_t, std::pair<c10::DeviceIndex, int64_t>> windows_;  // open peak windows: id -> (device, highest
                                                                     // allocated on it since)
  int64_t next_window_ = 0, next_serial_ = 0, total_ = 0;
};

NeuronAllocator& allocator();

// The creating stack of an allocation while sites are recorded; from Python (module.cpp).
std::vector<std::string> allocation_site();

}  // namespace neuron_lab
