// Devices, streams, events and generators of the emulated `neuron` backend: its device guard and
// PrivateUse1 hooks, as a C++ backend registers them (PyTorch's openreg reference backend is the model).
//
// Every op completes before it returns, so streams are names for one in-order queue per device and an
// event's timestamp is exact: work recorded before it is done when it is recorded.
#include "core.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>

namespace neuron_lab {
namespace {

std::atomic<int> n_devices{1};
thread_local c10::DeviceIndex current = 0;
thread_local std::map<c10::DeviceIndex, c10::StreamId> current_streams;
std::atomic<c10::StreamId> next_stream{1};

}  // namespace

void configure_devices(const std::vector<int64_t>& capacities) {
  TORCH_CHECK(!capacities.empty() && capacities.size() <= kMaxDevices, "neuron emulator: between 1 and ",
              kMaxDevices, " devices, got ", capacities.size());
  allocator().configure(capacities);
  n_devices = static_cast<int>(capacities.size());
}

c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(n_devices.load());
}

c10::DeviceIndex current_device() {
  return current;
}

c10::DeviceIndex checked_index(int64_t index) {
  if (index == -1) return current;
  TORCH_CHECK(index >= 0 && index < device_count(), "Invalid device id ", index, ": neuron has ",
                    static_cast<int>(device_count()), " device(s) (neuron:0..neuron:", device_count() - 1,
                    "); see NEURON_RT_VISIBLE_CORES and NEURON_LAB_INSTANCE");
  return static_cast<c10::DeviceIndex>(index);
}

void set_device(c10::DeviceIndex index) {
  current = checked_index(index);
}

// -- generators --------------------------------------------------------------------------------
namespace {

// A `neuron` generator around a CPU engine. CPU kernels refuse a generator of another device, so the
// fallback hands them the engine; seeding the wrapper seeds the engine, giving the CPU's stream.
class NeuronGenerator final : public c10::GeneratorImpl {
 public:
  NeuronGenerator(c10::DeviceIndex index, at::Generator engine)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine_(std::move(engine)) {}
  void set_current_seed(uint64_t seed) override { engine_.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { engine_.set_offset(offset); }
  uint64_t get_offset() const override { return engine_.get_offset(); }
  uint64_t current_seed() const override { return engine_.current_seed(); }
  uint64_t seed() override { return engine_.seed(); }
  void set_state(const c10::TensorImpl& state) override { engine_.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return engine_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  const at::Generator& engine() const { return engine_; }

 private:
  NeuronGenerator* clone_impl() const override { return new NeuronGenerator(device().index(), engine_.clone()); }
  at::Generator engine_;
};

std::vector<at::Generator>& default_generators() {
  static auto* gens = new std::vector<at::Generator>(kMaxDevices);
  return *gens;
}

std::mutex generators_mu;

}  // namespace

at::Generator new_generator(c10::DeviceIndex index) {
  index = checked_index(index);
  return at::make_generator<NeuronGenerator>(index, at::make_generator<at::CPUGeneratorImpl>());
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = checked_index(index);
  std::lock_guard<std::mutex> g(generators_mu);
  auto& gen = default_generators()[index];
  if (!gen.defined()) gen = new_generator(index);
  return gen;
}

at::Generator cpu_engine(const at::Generator& gen) {
  auto* impl = dynamic_cast<NeuronGenerator*>(gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'neuron' generator, got one for ", gen.device());
  return impl->engine();
}

// -- device guard ------------------------------------------------------------------------------
namespace {

struct EventRecord {
  int64_t ns = 0;
  c10::DeviceIndex device = 0;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct NeuronGuard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current;
    if (d.index() != old) set_device(d.index());
    return c10::Device(kType, old);
  }
  c10::Device getDevice() const override { return c10::Device(kType, current); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current = d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    auto idx = d.index() < 0 ? current : d.index();
    auto it = current_streams.find(idx);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, idx), it == current_streams.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, d.index() < 0 ? current : d.index()));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() < 0 ? current : d.index()), next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    current_streams[s.device_index()] = s.id();
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

// -- PrivateUse1 hooks --------------------------------------------------------------------------
struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current;
    set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    auto old = current;
    if (d >= 0 && d < device_count()) current = d;
    return old;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current);
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override { allocator().resize(storage, n); }
};

struct Registration {
  Registration() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator());
  }
};
Registration registration;

}  // namespace
}  // namespace neuron_lab
