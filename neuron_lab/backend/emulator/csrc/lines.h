// Reported calls counted by their user's line in the core: the calling frames walked here, under the GIL the
// delivery takes anyway, and Python called only for a line's first call and, of its next calls the subscriber asks
// for (its stacks), only those whose calling frames differ from every call it was handed at the line
// (neuron_lab.backend.events: subscribe's `roles`). Every function here is called with the GIL held.
#pragma once

#include <Python.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace neuron_lab {

// Where one call of an op of a kind was made: the user's frame and the innermost library frame below it, as code
// object and instruction offset (a line number is Python's to compute, once per line).
struct Line {
  const void* op = nullptr;
  int kind = 0;
  PyObject* user = nullptr;  // code objects, held by the roles cache
  PyObject* library = nullptr;
  int user_at = -1, library_at = -1;
  int64_t epoch = 0;  // the roles it was walked with: a line of older roles is not kept
  bool operator==(const Line&) const = default;
};

// A call's frames, innermost first, then (on a thread with no user frame) the main thread's: (code, offset).
using Frames = std::vector<std::pair<PyObject*, int>>;

struct Counted {  // calls at one line since the last take; `tally` is a new reference
  PyObject* tally;
  int64_t calls, host_ns;
};

// The line of this call of `op`, when calls of `kind` are counted by line and the walk meets the user's frame (on
// another thread with none, the main thread's); false sends the call to the subscriber. Throws pybind11::error_already_set when the roles callback raises.
bool line_of(const void* op, int kind, Line* line);
// Counts the call at `line` when the subscriber gave the line a tally and wants no stack of it (its frames are
// those of a call it was handed, or past the calls it asked for); says whether it did. Otherwise `frames` (a call
// the subscriber takes for its stack) are the call's.
bool count_at(const Line& line, int64_t host_ns, Frames* frames);
// What the subscriber returned for a call at `line`: the line's tally (kept at its first call) and how many of the
// line's next calls it takes when their frames are new; `frames`: those of the call, when count_at gave them.
void keep_tally(const Line& line, PyObject* tally, int stack_calls, Frames frames);
// The calls counted since the last take, zeroed here.
std::vector<Counted> take_counts();
// The kinds counted by line (a bit per kind), the subscriber's roles callback (nullptr: none) and the main thread's
// ident (a call on another thread with no user frame is the main thread's line's); the tallies so far are dropped
// (take_counts() first), and the roles cached so far too unless `roles` is the callback they were asked of (a bound
// method: the same function of the same object) or nullptr: kept for the next subscriber, holding the object of a
// bound method only weakly (they go when it goes: a session's locator after %unload_ext).
void set_lines(int kinds_mask, PyObject* roles, unsigned long main_thread);

}  // namespace neuron_lab
