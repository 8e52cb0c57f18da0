// `neuron` generators: a device generator wraps a CPU engine. CPU kernels refuse a generator of another device,
// so the fallback hands them the engine; seeding the wrapper seeds the engine, giving the CPU's stream.
#include "runtime/generator.h"

#include "runtime/device.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

namespace neuron_lab {
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

}  // namespace neuron_lab
