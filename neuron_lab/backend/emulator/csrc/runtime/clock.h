// The core's clocks. Host kernels' durations are read from the CPU's time-stamp counter where Linux keeps its own
// clock on it (x86-64, clocksource "tsc": constant-rate, synchronized across cores), else from the steady clock: every
// typed call times its kernel, and a steady-clock read goes through the vDSO's data page, which has left the cache by
// the next op (~30 ns a read when hot, several times that cold, in this VM; the counter ~11 ns, no memory read).
// Blocks allocated during a call take the call's start stamp, on the steady clock's scale, as their allocation time
// (the live list's age): no clock read of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace neuron_lab {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ticks();  // a stamp for durations: the time-stamp counter, or the steady clock's ns
int64_t ticks_ns(int64_t d);  // a difference of two stamps in ns (never negative)
int64_t steady_ns(int64_t stamp);  // a stamp as the steady clock's ns (now_ns's scale)

// A call of a kernel on the host. While one lives on a thread, allocations there take its time (nested calls their own).
class OpClock {
 public:
  OpClock() : start_(ticks()), outer_(current_) { current_ = start_; }
  ~OpClock() { current_ = outer_; }
  OpClock(const OpClock&) = delete;
  OpClock& operator=(const OpClock&) = delete;
  int64_t elapsed_ns() const { return ticks_ns(ticks() - start_); }
  // An allocation's time: the running call's start; outside a call, now.
  static int64_t allocation_ns() { return current_ ? steady_ns(*current_) : now_ns(); }

 private:
  static inline thread_local std::optional<int64_t> current_;  // the running call's start stamp
  int64_t start_;
  std::optional<int64_t> outer_;
};

}  // namespace neuron_lab
