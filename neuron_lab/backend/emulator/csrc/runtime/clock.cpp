// The time-stamp counter's rate, measured once against the steady clock when the core loads (clock.h says why).
#include "runtime/clock.h"

#include <fstream>
#include <string>

#if defined(__x86_64__) && defined(__linux__)
#include <x86intrin.h>
#define NEURON_LAB_TSC 1
#endif

namespace neuron_lab {
namespace {

// Nanoseconds a tick, over 2 ms of the steady clock (its ~30 ns jitter: a 2e-5 error); 0 where the counter is not
// the system's clock.
double ns_per_tick() {
#ifdef NEURON_LAB_TSC
  std::string source;
  std::ifstream("/sys/devices/system/clocksource/clocksource0/current_clocksource") >> source;
  if (source != "tsc") return 0;
  const int64_t n0 = now_ns();
  const uint64_t t0 = __rdtsc();
  int64_t n1 = n0;
  while (n1 - n0 < 2'000'000) n1 = now_ns();
  const uint64_t t1 = __rdtsc();
  return t1 > t0 ? double(n1 - n0) / double(t1 - t0) : 0;
#else
  return 0;
#endif
}

const double kNsPerTick = ns_per_tick();
// One stamp and the steady clock's ns read together, after the rate: steady_ns counts from them.
const int64_t kBaseTicks = ticks();
const int64_t kBaseNs = now_ns();

}  // namespace

int64_t ticks() {
#ifdef NEURON_LAB_TSC
  if (kNsPerTick > 0) return static_cast<int64_t>(__rdtsc());
#endif
  return now_ns();
}

int64_t steady_ns(int64_t stamp) {
  return kNsPerTick > 0 ? kBaseNs + static_cast<int64_t>(double(stamp - kBaseTicks) * kNsPerTick) : stamp;
}

int64_t ticks_ns(int64_t d) {
  if (d <= 0) return 0;  // a thread moved between cores whose counters differ by a few ticks
  return kNsPerTick > 0 ? static_cast<int64_t>(double(d) * kNsPerTick) : d;
}

}  // namespace neuron_lab
