// The device guard of the emulated `neuron` backend, registered for PrivateUse1 at load.
//
// Every op completes before it returns, so streams are names for one in-order queue per device and an
// event's timestamp is exact: work recorded before it is done when it is recorded.
#include "runtime/device.h"
#include "runtime/clock.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <limits>

namespace neuron_lab {
namespace {

// This thread's current stream per device, 0 (the default) until set: an array, not a map, since autograd's engine
// reads and swaps it around every node over device tensors. One slot per index a DeviceIndex can hold.
thread_local std::array<c10::StreamId, std::numeric_limits<c10::DeviceIndex>::max() + 1> current_streams{};
std::atomic<c10::StreamId> next_stream{1};

struct EventRecord {
  int64_t ns = 0;
  c10::DeviceIndex device = 0;
};

struct NeuronGuard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current_device();
    if (d.index() != old) set_device(d.index());
    return c10::Device(kType, old);
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { set_device_unchecked(d.index()); }
  c10::Stream getStream(c10::Device d) const override {
    auto idx = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, idx), current_streams[idx]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, d.index() < 0 ? current_device() : d.index()));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() < 0 ? current_device() : d.index()),
                       next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    current_streams[old.device_index()] = s.id();
    return old;
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = new EventRecord();
    auto* e = static_cast<EventRecord*>(*event);
    e->ns = now_ns();
    e->device = device_index >= 0 ? device_index : stream.device_index();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<EventRecord*>(event);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    return static_cast<double>(static_cast<EventRecord*>(end)->ns - static_cast<EventRecord*>(start)->ns) / 1e6;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuard);

}  // namespace
}  // namespace neuron_lab
