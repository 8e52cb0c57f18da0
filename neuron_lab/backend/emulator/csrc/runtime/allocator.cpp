// Device memory for the emulated `neuron` devices.
//
// Bytes are host memory. The statistics follow TorchNeuron 2.33's caching segment allocator: requests
// below 16 MiB reserve a size class (256 B at least, four classes per power of two), larger ones a
// multiple of 2 MiB; classes below 1 MiB are the small pool. A freed block's segment stays reserved
// (cached) until empty_cache() or an allocation that would pass the capacity releases the cache and
// retries.
//
// Host bytes are cached apart from that accounting, as CUDA's caching allocator keeps a freed block's memory: a
// freed small-pool block whose bytes nobody else holds keeps them (a size class's worth, with its cached CPU alias)
// for the next allocation of its class, newest first, so a training step's short-lived results land in memory that
// is still in cache and cost no malloc, free, StorageImpl or TensorImpl. At most kSpareLimit bytes a device are kept
// that way; empty_cache() and an out-of-memory retry return them. Nothing of it shows in any statistic, snapshot or
// out-of-memory decision: those read the segments only. A freed block without such bytes keeps its shell (up to
// kShells of them) for the next adopted result.
//
// Segments live in an emulated device address space of their own (per device, from kAddressBase up): a cached
// segment keeps its address when it is reused, so a memory-history snapshot (torch.neuron.memory._snapshot) shows
// the caching allocator's real state. These addresses are the emulated device's, never the host pointers that
// data_ptr() returns. History costs one relaxed atomic load per allocation while it is off.
#include "runtime/allocator.h"

#include "profiler/profiler.h"
#include "runtime/clock.h"
#include "runtime/device.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <tuple>

namespace neuron_lab {
namespace {

constexpr size_t kMinBlock = 256;
constexpr size_t kSmallLimit = 1 << 20;
constexpr size_t kClassLimit = 16 << 20;
constexpr size_t kLargeRound = 2 << 20;
constexpr uint64_t kAddressBase = uint64_t(1) << 40;  // device i's segments start at (i + 1) TiB
constexpr uint64_t kAddressAlign = 512;
constexpr int64_t kSpareLimit = 64 << 20;  // host bytes a device's freed blocks may keep for reuse
constexpr size_t kShells = 4096;  // freed blocks kept without bytes

using c10::CachingAllocator::StatType;

size_t size_class(size_t n) {
  if (n <= kMinBlock) return kMinBlock;
  if (n >= kClassLimit) return (n + kLargeRound - 1) / kLargeRound * kLargeRound;
  size_t pow2 = std::bit_floor(n - 1);  // pow2 < n <= 2 * pow2
  size_t step = pow2 / 4;
  return (n + step - 1) / step * step;
}

// A small-pool size class's index: 256 B is 0, then four classes a power of two (pow2 + k * pow2 / 4, k = 1..4).
size_t small_index(size_t size_class) {
  if (size_class <= kMinBlock) return 0;
  size_t pow2 = std::bit_floor(size_class - 1);
  return 1 + 4 * static_cast<size_t>(std::countr_zero(pow2 / kMinBlock)) + (size_class - pow2) / (pow2 / 4) - 1;
}
static_assert(kSmallLimit == size_t(1) << 20 && kSmallClasses == 1 + 4 * 12, "one index for each small class");

std::string format_size(int64_t n) {
  const char* units[] = {"GiB", "MiB", "KiB"};
  const int64_t scales[] = {int64_t(1) << 30, int64_t(1) << 20, int64_t(1) << 10};
  char buf[64];
  for (int i = 0; i < 3; ++i) {
    if (n >= scales[i]) {
      std::snprintf(buf, sizeof(buf), "%.2f %s", double(n) / double(scales[i]), units[i]);
      return buf;
    }
  }
  std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(n));
  return buf;
}

// Calls f on every counter array of the device statistics.
template <typename F>
void for_each_stat(c10::CachingDeviceAllocator::DeviceStats& s, F f) {
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
                    &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& st : *arr) f(st);
  }
}

// Calls f(small, segments) on each size class's cached segments, small pool then large, ascending size.
template <typename D, typename F>
void for_each_cached(D& d, F f) {
  for (auto& segs : d.cached_small) f(true, segs);
  for (auto& [_, segs] : d.cached_large) f(false, segs);
}

template <typename F>
void for_pool(bool small, F f) {
  f(static_cast<size_t>(StatType::AGGREGATE));
  f(static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL));
}

// torch.profiler(profile_memory=True) records each allocation and free with the device's totals, as it does for
// CUDA's allocator: the "[memory]" events, the memory columns of key_averages() and the trace's memory counter.
void report_to_profiler(void* ptr, int64_t delta, const DeviceMemory& d, c10::DeviceIndex device) {
  if (!c10::memoryProfilingEnabled()) return;
  c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(d.stats.allocated_bytes[0].current),
                                   static_cast<size_t>(d.stats.reserved_bytes[0].current),
                                   c10::Device(c10::DeviceType::PrivateUse1, device));
}

// An adopted CPU result's bytes leave the CPU's accounting as they become the device's: torch.profiler's CPU memory
// records their free now, as TorchNeuron frees a fallback's CPU result once it is copied to the device, and their
// eventual free is the device's alone. Left to the CPU allocator's deleter, a result adopted before a memory profile
// and freed in it made torch warn once a process ("Memory block of unknown size was allocated before the profiling
// started", CPUAllocator.cpp), and one adopted in it stayed in the CPU's timeline beside the device's.
void leave_cpu_accounting(const c10::Storage& host) {
  static const c10::DeleterFnPtr reported = c10::GetDefaultCPUAllocator()->raw_deleter();
  c10::DataPtr& p = host.unsafeGetStorageImpl()->mutable_data_ptr();
  if (reported != &c10::free_cpu && p.compare_exchange_deleter(reported, &c10::free_cpu)) {
    c10::profiledCPUMemoryReporter().Delete(p.get());
  }
}

void delete_block(void* ctx) {
  allocator().release(static_cast<Block*>(ctx));
}

}  // namespace

NeuronAllocator& allocator() {
  static auto* a = new NeuronAllocator();  // never destroyed: storages may be freed during interpreter exit
  return *a;
}

void NeuronAllocator::configure(const std::vector<int64_t>& capacities) {
  std::lock_guard<std::mutex> g(mu_);
  if (devices_.size() < capacities.size()) devices_.resize(capacities.size());
  for (size_t i = 0; i < capacities.size(); ++i) {
    devices_[i].capacity = capacities[i];
    if (devices_[i].next_addr == 0) devices_[i].next_addr = kAddressBase * (i + 1);
  }
}

int64_t NeuronAllocator::capacity(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  return devices_.at(device).capacity;
}

Segment NeuronAllocator::reserve(size_t n, c10::DeviceIndex device, bool* small, const Context& ctx) {
  size_t seg = size_class(n);
  *small = seg <= kSmallLimit;
  DeviceMemory& d = devices_.at(device);
  std::vector<Segment>* cached = nullptr;
  if (*small) {
    cached = &d.cached_small[small_index(seg)];
  } else if (auto it = d.cached_large.find(seg); it != d.cached_large.end()) {
    cached = &it->second;
  }
  if (cached && !cached->empty()) {  // reuse the newest cached segment of the class: same address
    Segment out = std::move(cached->back());
    cached->pop_back();  // the class's entry stays, empty: the next free of the class allocates nothing
    d.cached_bytes -= static_cast<int64_t>(seg);
    return out;
  }
  auto reserved = [&] { return d.stats.reserved_bytes[0].current; };
  if (reserved() + static_cast<int64_t>(seg) > d.capacity && d.cached_bytes > 0) {
    release_cached(d, device);
    d.stats.num_alloc_retries += 1;
  }
  if (reserved() + static_cast<int64_t>(seg) > d.capacity) {
    d.stats.num_ooms += 1;
    record(d, TraceEntry::kOom, static_cast<uint64_t>(std::max<int64_t>(d.capacity - reserved(), 0)), n, ctx);
    int64_t allocated = d.stats.allocated_bytes[0].current;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", static_cast<int>(device),
                     " out of memory (emulated): tried to allocate ", format_size(static_cast<int64_t>(n)), "; ",
                     format_size(allocated), " of ", format_size(d.capacity), " already allocated, ",
                     format_size(d.capacity - reserved()), " free (", format_size(reserved() - allocated),
                     " reserved by the caching allocator). The emulated capacity is set by NEURON_LAB_DEVICE_MEMORY.");
  }
  for_pool(*small, [&](size_t i) {
    d.stats.reserved_bytes[i].increase(seg);
    d.stats.segment[i].increase(1);
  });
  d.stats.num_device_alloc += 1;
  Segment fresh{d.next_addr, seg, ctx};
  d.next_addr += (seg + kAddressAlign - 1) / kAddressAlign * kAddressAlign;
  record(d, TraceEntry::kSegmentAlloc, fresh.addr, seg, ctx);
  return fresh;
}

NeuronAllocator::Origin NeuronAllocator::origin() {
  Origin o{gather(1), OpClock::allocation_ns(), {}};
  if (record_sites) o.site = allocation_site();
  return o;
}

c10::DataPtr NeuronAllocator::register_block(c10::Storage host, size_t capacity, size_t n,
                                             std::optional<Segment> segment, bool small, c10::DeviceIndex device,
                                             Origin origin) {
  std::unique_ptr<Block> owned;  // a shell made here goes if the reservation raises OutOfMemoryError
  std::lock_guard<std::mutex> g(mu_);
  if (shells_.empty()) {
    owned = std::make_unique<Block>();
  } else {
    owned.reset(shells_.back());
    shells_.pop_back();
  }
  Block* b = owned.get();
  b->host = std::move(host);
  b->host_nbytes = b->host.nbytes();
  b->capacity = capacity;
  if (segment) {
    b->segment = std::move(*segment);
    b->small = small;
  } else {
    b->segment = reserve(n, device, &b->small, origin.context);  // may raise OutOfMemoryError; the block goes
  }
  owned.release();
  return enter(b, n, std::move(origin), device, false);
}

c10::DataPtr NeuronAllocator::enter(Block* b, size_t n, Origin origin, c10::DeviceIndex device, bool spare) {
  b->ptr = b->host.mutable_data();
  b->nbytes = n;
  b->context = std::move(origin.context);
  b->device = device;
  b->created_ns = origin.created_ns;
  b->site = std::move(origin.site);
  b->live = true;
  DeviceMemory& d = devices_[device];
  for_pool(b->small, [&](size_t i) {
    d.stats.allocated_bytes[i].increase(n);
    d.stats.requested_bytes[i].increase(n);
    d.stats.active_bytes[i].increase(n);
    d.stats.allocation[i].increase(1);
    d.stats.active[i].increase(1);
  });
  b->serial = next_serial_++;
  if (!spare) by_ptr_[b->ptr] = b;
  total_ += static_cast<int64_t>(n);
  if (d.windows) d.window_high = std::max(d.window_high, d.stats.allocated_bytes[0].current);
  report_to_profiler(b->ptr, static_cast<int64_t>(n), d, device);
  record(d, TraceEntry::kAlloc, b->segment.addr, n, b->context);
  return c10::DataPtr(b->ptr, b, &delete_block, c10::Device(c10::DeviceType::PrivateUse1, device));
}

c10::DataPtr NeuronAllocator::allocate(size_t n) {
  return allocate_on(n, current_device());
}

c10::DataPtr NeuronAllocator::allocate_on(size_t n, c10::DeviceIndex device) {
  bool small = true;
  Segment seg;
  Origin o = origin();
  // One byte at least, so every live allocation has a pointer of its own.
  size_t bytes = std::max<size_t>(n, 1);
  {  // a spare block's bytes serve it under this one lock
    std::lock_guard<std::mutex> g(mu_);
    seg = reserve(n, device, &small, o.context);  // may raise OutOfMemoryError before any host memory is taken
    if (Block* spare = small ? take_spare(devices_[device], seg.size) : nullptr) {
      spare->host.set_nbytes(bytes);
      spare->host_nbytes = bytes;
      spare->segment = std::move(seg);
      spare->small = small;
      return enter(spare, n, std::move(o), device, true);
    }
  }
  // A small-pool block takes its whole class, so that once freed it can serve any request of the class. Taken
  // from the host directly, not through the CPU allocator, so that torch.profiler counts these bytes once, as
  // the device's.
  size_t capacity = small ? seg.size : 0;
  void* data = nullptr;
  try {
    data = c10::alloc_cpu(std::max(bytes, capacity));
  } catch (const c10::Error&) {  // the host has not the bytes: the segment goes back, cached, as after a free
    {
      std::lock_guard<std::mutex> g(mu_);
      cache(devices_[device], std::move(seg), small);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", static_cast<int>(device), " out of memory (emulated): ",
                     "the host could not provide ", format_size(static_cast<int64_t>(n)),
                     " for the emulated device's bytes (they live in host memory; NEURON_LAB_DEVICE_MEMORY sets the "
                     "emulated capacity, not the host's)");
  }
  c10::Storage host(c10::Storage::use_byte_size_t(), bytes,
                    c10::DataPtr(data, data, &c10::free_cpu, c10::Device(c10::DeviceType::CPU)), nullptr, false);
  return register_block(std::move(host), capacity, n, std::move(seg), small, device, std::move(o));
}

c10::DataPtr NeuronAllocator::adopt(const c10::Storage& host, c10::DeviceIndex device) {
  size_t n = host.nbytes();
  if (host.data() == nullptr) {  // an empty result may have no buffer
    c10::Storage own(c10::Storage::use_byte_size_t(), 1, c10::GetCPUAllocator(), false);
    return register_block(std::move(own), 0, n, std::nullopt, true, device, origin());
  }
  leave_cpu_accounting(host);
  // Its bytes are the device's now: a CPU tensor over them that grew would move them under the device storage.
  host.unsafeGetStorageImpl()->set_resizable(false);
  return register_block(host, 0, n, std::nullopt, true, device, origin());
}

void NeuronAllocator::cache(DeviceMemory& d, Segment segment, bool small) {
  d.cached_bytes += static_cast<int64_t>(segment.size);
  auto& cached = small ? d.cached_small[small_index(segment.size)] : d.cached_large[segment.size];
  cached.push_back(std::move(segment));
}

namespace {

// Whether a freed block's host bytes may serve the next allocation of its class: they are the allocator's own and
// nothing but the block (and its cached alias, held by nothing else) holds them.
bool reusable(const Block& b) {
  if (b.capacity == 0 || b.alias.busy.load(std::memory_order_relaxed)) return false;
  const at::Tensor& a = b.alias.tensor;
  size_t holders = 1;
  if (a.defined()) {
    if (a.use_count() != 1 || a.storage().unsafeGetStorageImpl() != b.host.unsafeGetStorageImpl()) return false;
    holders = 2;
  }
  return b.host.use_count() == holders;
}

}  // namespace

void NeuronAllocator::release(Block* b) {
  Context freed_at = gather(3);
  c10::Storage host;  // bytes that go back to the host, after the lock
  at::Tensor alias;
  std::unique_ptr<Block> doomed;
  {
    std::lock_guard<std::mutex> g(mu_);
    DeviceMemory& d = devices_[b->device];
    for_pool(b->small, [&](size_t i) {
      d.stats.allocated_bytes[i].decrease(b->nbytes);
      d.stats.requested_bytes[i].decrease(b->nbytes);
      d.stats.active_bytes[i].decrease(b->nbytes);
      d.stats.allocation[i].decrease(1);
      d.stats.active[i].decrease(1);
    });
    const Context& ctx = freed_at ? freed_at : b->context;
    record(d, TraceEntry::kFreeRequested, b->segment.addr, b->nbytes, ctx);
    record(d, TraceEntry::kFreeCompleted, b->segment.addr, b->nbytes, ctx);
    cache(d, std::move(b->segment), b->small);
    b->live = false;
    total_ -= static_cast<int64_t>(b->nbytes);
    report_to_profiler(b->ptr, -static_cast<int64_t>(b->nbytes), d, b->device);
    b->context.reset();
    b->storage.reset();
    b->site.clear();
    b->shape.clear();
    b->dtype = c10::ScalarType::Undefined;
    if (reusable(*b) && d.spare_bytes + static_cast<int64_t>(b->capacity) <= kSpareLimit) {
      d.spare[small_index(b->capacity)].push_back(b);  // stays in by_ptr_: its bytes stay
      d.spare_bytes += static_cast<int64_t>(b->capacity);
    } else {
      by_ptr_.erase(b->ptr);
      host = std::move(b->host);
      alias = std::move(b->alias.tensor);
      b->capacity = 0;
      if (shells_.size() < kShells) {
        shells_.push_back(b);
      } else {
        doomed.reset(b);
      }
    }
  }
}

Block* NeuronAllocator::take_spare(DeviceMemory& d, size_t size_class) {
  auto& spare = d.spare[small_index(size_class)];
  if (spare.empty()) return nullptr;
  Block* b = spare.back();
  spare.pop_back();
  d.spare_bytes -= static_cast<int64_t>(b->capacity);
  return b;
}

void NeuronAllocator::drop_spare(DeviceMemory& d) {
  for (auto& blocks : d.spare) {
    for (Block* b : blocks) {
      by_ptr_.erase(b->ptr);
      delete b;
    }
    blocks.clear();
  }
  d.spare_bytes = 0;
}

void NeuronAllocator::release_cached(DeviceMemory& d, c10::DeviceIndex device) {
  for_each_cached(d, [&](bool small, std::vector<Segment>& segs) {
    if (segs.empty()) return;
    int64_t count = static_cast<int64_t>(segs.size());
    size_t size = segs.front().size;
    for_pool(small, [&](size_t i) {
      d.stats.reserved_bytes[i].decrease(size * count);
      d.stats.segment[i].decrease(count);
    });
    d.stats.num_device_free += count;
    for (const auto& s : segs) record(d, TraceEntry::kSegmentFree, s.addr, s.size, s.context);
    segs.clear();
  });
  d.cached_large.clear();
  d.cached_bytes = 0;
  drop_spare(d);
}

void NeuronAllocator::empty_cache(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  release_cached(devices_.at(device), device);
}

void NeuronAllocator::emptyCache(c10::MempoolId_t) {
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < devices_.size(); ++i) release_cached(devices_[i], static_cast<c10::DeviceIndex>(i));
}

// -- memory history ------------------------------------------------------------------------------
namespace {

// A device's trace, oldest first (the ring's next slot holds the oldest entry once it is full).
std::vector<TraceEntry> in_order(const DeviceMemory& d) {
  std::vector<TraceEntry> out(d.trace.begin() + static_cast<std::ptrdiff_t>(d.trace_next), d.trace.end());
  out.insert(out.end(), d.trace.begin(), d.trace.begin() + static_cast<std::ptrdiff_t>(d.trace_next));
  return out;
}

}  // namespace

Context NeuronAllocator::gather(int level) const {
  if (context_.load(std::memory_order_relaxed) < level) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
}

void NeuronAllocator::record(DeviceMemory& d, TraceEntry::Action action, uint64_t addr, size_t size,
                             const Context& ctx) {
  if (!history_.load(std::memory_order_relaxed)) return;
  TraceEntry te{action, addr, size, profile_clock() / 1000, context_.load(std::memory_order_relaxed) >= 2 ? ctx : nullptr};
  if (d.trace.size() < max_entries_) {
    d.trace.push_back(std::move(te));
  } else {
    d.trace[d.trace_next] = std::move(te);
    d.trace_next = (d.trace_next + 1) % max_entries_;
  }
}

void NeuronAllocator::record_history(bool enabled, int context, size_t max_entries, bool clear) {
  std::lock_guard<std::mutex> g(mu_);
  history_.store(enabled, std::memory_order_relaxed);
  context_.store(enabled ? context : 0, std::memory_order_relaxed);
  max_entries_ = std::max<size_t>(max_entries, 1);
  for (auto& d : devices_) {
    if (!enabled || clear) {
      d.trace.clear();
    } else if (d.trace_next != 0 || d.trace.size() > max_entries_) {  // the ring's size changes: keep the newest
      auto kept = in_order(d);
      d.trace.assign(kept.end() - static_cast<std::ptrdiff_t>(std::min(kept.size(), max_entries_)), kept.end());
    }
    d.trace_next = 0;
  }
}

MemorySnapshot NeuronAllocator::snapshot() {
  MemorySnapshot out;
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& [_, b] : by_ptr_) {
    if (b->live) out.segments.push_back({b->device, b->segment, b->small, true, b->nbytes, b->context});
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    const DeviceMemory& d = devices_[i];
    auto device = static_cast<c10::DeviceIndex>(i);
    for_each_cached(d, [&](bool small, const std::vector<Segment>& segs) {
      for (const auto& s : segs) out.segments.push_back({device, s, small, false, 0, nullptr});
    });
    out.traces.push_back(in_order(d));
  }
  std::sort(out.segments.begin(), out.segments.end(), [](const SegmentState& a, const SegmentState& b) {
    return std::tie(a.device, a.segment.addr) < std::tie(b.device, b.segment.addr);
  });
  return out;
}

void NeuronAllocator::resize(const c10::Storage& storage, size_t n) {
  c10::DeviceIndex device = storage.device().index();
  Block* old = block_of(storage.data_ptr());
  c10::DataPtr fresh = allocate_on(n, device);
  size_t keep = std::min(n, storage.nbytes());
  if (keep) std::memcpy(fresh.get(), storage.data(), keep);
  if (old) {
    Block* b = block_of(fresh);
    b->dtype = old->dtype;
    b->shape = old->shape;
    b->storage = old->storage;
  }
  c10::Storage(storage).set_data_ptr_noswap(std::move(fresh));
  c10::Storage(storage).set_nbytes(n);
}

Block* NeuronAllocator::block_of(const c10::DataPtr& p) {
  return p.get_deleter() == &delete_block ? static_cast<Block*>(p.get_context()) : nullptr;
}

void NeuronAllocator::describe(const at::Tensor& t) {
  if (Block* b = block_of(t.storage().data_ptr())) {
    b->dtype = t.scalar_type();
    b->shape.assign(t.sizes().begin(), t.sizes().end());
    b->storage = c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl());
  }
}

c10::intrusive_ptr<c10::StorageImpl> NeuronAllocator::storage_at(const void* ptr) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = by_ptr_.find(ptr);
  if (it == by_ptr_.end() || !it->second->live || !it->second->storage) return {};
  return it->second->storage->lock();
}

void NeuronAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

c10::CachingDeviceAllocator::DeviceStats NeuronAllocator::getDeviceStats(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  return devices_.at(device).stats;
}

void NeuronAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  auto& s = devices_.at(device).stats;
  for_each_stat(s, [](c10::CachingAllocator::Stat& st) { st.reset_accumulated(); });
  s.num_alloc_retries = s.num_ooms = s.num_device_alloc = s.num_device_free = 0;
}

void NeuronAllocator::resetPeakStats(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  for_each_stat(devices_.at(device).stats, [](c10::CachingAllocator::Stat& st) { st.reset_peak(); });
}

std::pair<size_t, size_t> NeuronAllocator::getMemoryInfo(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  auto& d = devices_.at(device);
  auto used = d.stats.reserved_bytes[0].current;
  return {static_cast<size_t>(std::max<int64_t>(d.capacity - used, 0)), static_cast<size_t>(d.capacity)};
}

void NeuronAllocator::fold_windows(c10::DeviceIndex device) {
  DeviceMemory& d = devices_.at(device);
  for (auto& [_, w] : windows_) {
    if (w.first == device) w.second = std::max(w.second, d.window_high);
  }
  d.window_high = d.stats.allocated_bytes[0].current;
}

int64_t NeuronAllocator::open_window(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> g(mu_);
  fold_windows(device);
  devices_[device].windows += 1;
  windows_[++next_window_] = {device, devices_[device].stats.allocated_bytes[0].current};
  return next_window_;
}

int64_t NeuronAllocator::close_window(int64_t window) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = windows_.find(window);
  if (it == windows_.end()) return 0;
  c10::DeviceIndex device = it->second.first;
  fold_windows(device);
  int64_t peak = it->second.second;
  windows_.erase(it);
  devices_[device].windows -= 1;
  return std::max(peak, devices_[device].stats.allocated_bytes[0].current);
}

int64_t NeuronAllocator::total_allocated() {
  std::lock_guard<std::mutex> g(mu_);
  return total_;
}

std::vector<Block> NeuronAllocator::live_blocks() {
  std::vector<Block> out;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [_, b] : by_ptr_) {
      if (!b->live) continue;
      Block copy;
      copy.ptr = b->ptr;
      copy.nbytes = b->nbytes;
      copy.device = b->device;
      copy.created_ns = b->created_ns;
      copy.serial = b->serial;
      copy.dtype = b->dtype;
      copy.shape = b->shape;
      copy.site = b->site;
      out.push_back(std::move(copy));
    }
  }
  std::sort(out.begin(), out.end(), [](const Block& a, const Block& b) { return a.serial < b.serial; });
  return out;
}

}  // namespace neuron_lab
