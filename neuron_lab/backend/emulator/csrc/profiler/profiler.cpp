// The emulated device in torch.profiler. PyTorch's PrivateUse1 profiler hooks are C++ only, so the core registers
// both: a Kineto activity profiler (`profile(activities=[..., ProfilerActivity.PrivateUse1])`), whose session turns
// the host-kernel time of each device op into a kernel on the lane of its `neuron:i` device, and the legacy
// ProfilerStubs (`use_device="neuron"`), whose events read the same kernel time. Off-device calls (CPU fallbacks,
// host ops) show as host work on the calling thread instead. Nothing is recorded unless a profiler asks: an op
// pays one relaxed atomic load. A torch without Kineto's headers gets the legacy stubs only.
#if __has_include(<libkineto.h>)
#define NEURON_LAB_KINETO 1
#ifndef USE_KINETO
#define USE_KINETO  // the torch wheel is built with Kineto; its profiler headers are guarded by this macro
#endif
#define FMT_HEADER_ONLY  // Kineto's activity metadata formats with fmt, which libtorch does not export
#else
#define NEURON_LAB_KINETO 0
#endif

#include "profiler/profiler.h"

#include "runtime/device.h"

#include <c10/core/AutogradState.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#if NEURON_LAB_KINETO
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#endif

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace neuron_lab {

std::atomic<bool> g_profiling{false};

namespace {

enum class Work : uint8_t { kKernel, kHost, kCopy };

struct Span {
  std::string name;
  std::string kind;  // the kind of call, as Python names it ("" for copies)
  int64_t start_ns, end_ns;  // Unix epoch, as Kineto's CPU ops
  int64_t bytes;
  int32_t correlation, tid;
  c10::DeviceIndex device;
  Work work;
};

std::mutex spans_mu;
std::vector<Span> spans;
std::vector<std::string> kind_names;  // index -> name
std::vector<std::string> host_labels;  // index -> "CPU fallback" for calls that run on the host, "" for device work
std::atomic<bool> kineto_on{false};  // a Kineto session is recording
bool legacy_on = false;  // guarded by spans_mu

void update_profiling() {
  g_profiling.store(kineto_on.load() || legacy_on, std::memory_order_relaxed);
}

// PyTorch pushes the profiled op's correlation id before the op runs; a kernel takes the innermost one.
thread_local std::vector<uint64_t> correlations;
// Kernel time run on this thread, for the legacy stubs' events.
thread_local int64_t kernel_ns_total = 0;

int32_t thread_id() {  // the system's, as Kineto names CPU threads
  return static_cast<int32_t>(::syscall(SYS_gettid));
}

int32_t current_correlation() {
  return correlations.empty() ? 0 : static_cast<int32_t>(correlations.back());
}

void add(Span s) {
  std::lock_guard<std::mutex> g(spans_mu);
  if (kineto_on) spans.push_back(std::move(s));
}

// -- Kineto ---------------------------------------------------------------------------------------------
#if NEURON_LAB_KINETO
using libkineto::ActivityType;

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    std::lock_guard<std::mutex> g(spans_mu);
    spans.clear();
    kineto_on = true;
    update_profiling();
    backward_on_device_thread();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    std::lock_guard<std::mutex> g(spans_mu);
    kineto_on = false;
    update_profiling();
    backward_where_it_was();
    taken_.swap(spans);
    spans.clear();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start,
                    int64_t end) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start, end, "neuron");
    buffer_->gpuOpCount = -1;  // as PyTorch's own CPU trace
    const int32_t pid = libkineto::processId();
    std::set<c10::DeviceIndex> devices;
    for (const auto& s : taken_) {
      ActivityType type = s.work == Work::kKernel ? ActivityType::CONCURRENT_KERNEL
                          : s.work == Work::kCopy ? ActivityType::GPU_MEMCPY
                                                  : ActivityType::PRIVATEUSE1_RUNTIME;
      buffer_->emplace_activity(buffer_->span, type, s.name);
      auto& a = *buffer_->activities.back();
      a.startTime = s.start_ns;
      a.endTime = s.end_ns;
      a.id = s.correlation;
      a.linked = s.correlation ? linked(s.correlation) : nullptr;
      a.threadId = s.tid;
      const std::string where = "neuron:" + std::to_string(static_cast<int>(s.device));
      a.addMetadataQuoted("device", where);
      if (s.work == Work::kHost) {  // on the calling thread, beside its CPU ops
        a.device = pid;
        a.resource = s.tid;
        a.addMetadataQuoted("kind", s.kind);
      } else {  // on the device's lane
        a.device = s.device;
        a.resource = 0;
        devices.insert(s.device);
        if (s.work != Work::kCopy) a.addMetadataQuoted("kind", s.kind);
        if (s.bytes) a.addMetadata("bytes", s.bytes);
      }
      logger.handleActivity(a);
    }
    taken_.clear();
    // One process per device in the trace viewer, named as PyTorch names the device, below the host's. Kineto
    // takes one from getDeviceInfo() (and then names no GPUs of its own); the others are logged here.
    first_ = devices.empty() ? 0 : *devices.begin();
    resources_.clear();
    for (auto d : devices) {
      if (d != first_) logger.handleDeviceInfo(device_info(d), start);
      resources_.push_back({0, 0, d, "kernels"});
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(device_info(first_));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return resources_; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { correlations.push_back(id); }

  void popCorrelationId() override {
    if (!correlations.empty()) correlations.pop_back();
  }

 private:
  static libkineto::DeviceInfo device_info(c10::DeviceIndex d) {
    const std::string name = "neuron:" + std::to_string(static_cast<int>(d));
    return {d, (1 << 24) + d, name, name};
  }

  // Off the profiler the emulator runs backward on the calling thread (backend/emulator/__init__.py says why);
  // while a trace records, autograd's device thread runs it, as on TorchNeuron, so the trace has its threads.
  // PyTorch keeps the setting per thread: the thread that starts the session's is set, and restored at its stop.
  void backward_on_device_thread() {
    auto& state = c10::AutogradState::get_tls_state();
    multithreading_before_ = state.get_multithreading_enabled();
    starter_ = std::this_thread::get_id();
    state.set_multithreading_enabled(true);
  }

  void backward_where_it_was() {
    if (multithreading_before_ && std::this_thread::get_id() == starter_)
      c10::AutogradState::get_tls_state().set_multithreading_enabled(*multithreading_before_);
    multithreading_before_.reset();
  }

  std::optional<bool> multithreading_before_;
  std::thread::id starter_;
  std::vector<Span> taken_;
  c10::DeviceIndex first_ = 0;
  // Handed to Kineto whole: its activities are what the logger was given, so their addresses must not move.
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<libkineto::ResourceInfo> resources_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // Every profile configures every child profiler; only one that asked for the device gets a session.
    if (!types.count(ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);
#endif

// -- legacy stubs (`torch.autograd.profiler.profile(use_device="neuron")`) ---------------------------------
// An event is the thread's kernel time so far: the device time between two events is the kernel time between them.
struct Stamp {
  int64_t kernel_ns;
};

struct NeuronStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    {
      std::lock_guard<std::mutex> g(spans_mu);
      if (!legacy_on) {
        legacy_on = true;  // from now on kernels are timed: the stubs cannot tell when profiling ends
        update_profiling();
      }
    }
    if (device) *device = current_device();
    if (event) *event = std::make_shared<Stamp>(Stamp{kernel_ns_total});
    if (cpu_ns) *cpu_ns = c10::getTime();
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    if (!a || !b || !*a || !*b) return 0.f;
    auto ns = static_cast<const Stamp*>(b->get())->kernel_ns - static_cast<const Stamp*>(a->get())->kernel_ns;
    return static_cast<float>(ns) / 1000.f;  // microseconds
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}

  void onEachDevice(std::function<void(int)> op) const override {
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, 0));
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      guard.set_index(i);
      op(i);
    }
  }

  void synchronize() const override {}  // ops complete before they return
  bool enabled() const override { return true; }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} register_stubs;

}  // namespace

int64_t profile_clock() {
  return c10::getTime();
}

void trace_kernel(const std::string& name, c10::DeviceIndex device, int kind, int64_t start_ns, int64_t end_ns) {
  const bool host = kind < static_cast<int>(host_labels.size()) && !host_labels[kind].empty();
  if (!host) kernel_ns_total += end_ns - start_ns;
  if (!kineto_on.load(std::memory_order_relaxed)) return;
  const std::string& kind_name = kind < static_cast<int>(kind_names.size()) ? kind_names[kind] : name;
  add({host ? host_labels[kind] + ": " + name : name, kind_name, start_ns, end_ns, 0, current_correlation(),
       thread_id(), device, host ? Work::kHost : Work::kKernel});
}

void trace_copy(bool to_device, bool from_device, c10::DeviceIndex device, int64_t bytes, int64_t start_ns,
                int64_t end_ns) {
  kernel_ns_total += end_ns - start_ns;
  if (!kineto_on.load(std::memory_order_relaxed)) return;
  const char* name = to_device && from_device ? "Memcpy DtoD (neuron -> neuron)"
                     : to_device             ? "Memcpy HtoD (host -> neuron)"
                                             : "Memcpy DtoH (neuron -> host)";
  add({name, "", start_ns, end_ns, bytes, current_correlation(), thread_id(), device, Work::kCopy});
}

bool tracing() {
  return kineto_on.load(std::memory_order_relaxed);
}

void trace_collective(const std::string& name, c10::DeviceIndex device, int64_t bytes, int64_t start_ns,
                      int64_t end_ns) {
  if (!kineto_on.load(std::memory_order_relaxed)) return;
  // Not linked to the innermost CPU op: a collective is its own call (DDP's come from autograd's hooks, inside
  // whatever op was running), and tables list it as such.
  add({name, "collective", start_ns, end_ns, bytes, 0, thread_id(), device, Work::kKernel});
}

void set_trace_kinds(const std::vector<std::string>& names, const std::vector<std::string>& labels) {
  std::lock_guard<std::mutex> g(spans_mu);
  kind_names = names;
  host_labels = labels;
}

bool profiler_registered() {
#if NEURON_LAB_KINETO
  if (!torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory()) return false;
#endif
  return torch::profiler::impl::privateuse1Stubs()->enabled();
}

}  // namespace neuron_lab
