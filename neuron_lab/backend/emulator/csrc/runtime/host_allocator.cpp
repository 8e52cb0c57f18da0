// Pinned host memory: CPU allocations remembered by address, so the hooks can say a pointer is pinned.
#include "runtime/host_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace neuron_lab {
namespace {

std::mutex pinned_mu;
std::unordered_set<const void*> pinned;

struct Pinned {
  c10::DataPtr inner;
};

void delete_pinned(void* ctx) {
  auto* p = static_cast<Pinned*>(ctx);
  {
    std::lock_guard<std::mutex> g(pinned_mu);
    pinned.erase(p->inner.get());
  }
  delete p;
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    auto* p = new Pinned{c10::GetCPUAllocator()->allocate(std::max<size_t>(n, 1))};
    void* data = p->inner.get();
    {
      std::lock_guard<std::mutex> g(pinned_mu);
      pinned.insert(data);
    }
    return c10::DataPtr(data, p, &delete_pinned, c10::Device(c10::DeviceType::CPU));
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

}  // namespace

c10::Allocator* pinned_allocator() {
  static auto* a = new PinnedAllocator();
  return a;
}

bool is_pinned_ptr(const void* data) {
  std::lock_guard<std::mutex> g(pinned_mu);
  return pinned.count(data) > 0;
}

}  // namespace neuron_lab
