// Reported calls counted by line in C++ (lines.h): a walk of the calling frames with each code object's role cached by
// pointer (Python decides a role once, for as long as the subscriber's roles stay the same), then one hash-map
// increment per call; while the subscriber still takes stacks of a line, the call's frames are compared with those it
// was handed (a loop repeats one stack: Python sees it once).
#include "lines.h"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>

namespace neuron_lab {
namespace {

enum Role : int { kInternal = 0, kLibrary = 1, kUser = 2, kAsk = 3 };  // neuron_lab.backend.events

struct LineHash {
  size_t operator()(const Line& l) const {
    size_t h = std::hash<const void*>()(l.op) ^ (static_cast<size_t>(l.kind) << 1);
    h = h * 31 + std::hash<const void*>()(l.user) + static_cast<size_t>(l.user_at);
    return h * 31 + std::hash<const void*>()(l.library) + static_cast<size_t>(l.library_at);
  }
};

struct Tally {
  PyObject* fn;  // owned
  int64_t calls = 0, host_ns = 0;
  int stack_calls = 0;  // of the line's next calls, how many the subscriber takes when their frames are new
  std::vector<Frames> seen;  // the frames of the calls it was handed (codes owned)
};

void release(Tally& t) {
  Py_DECREF(t.fn);
  for (const auto& frames : t.seen) {
    for (const auto& [code, _] : frames) Py_DECREF(code);
  }
}

int lined = 0;
PyObject* roles_fn = nullptr;  // owned: the subscriber's, while one counts by line
// The callback the cached roles came from: a bound method as its function (owned) and a weak reference to its object
// (a session's locator: cell after cell a new bound method of it), so that the roles kept while nobody subscribes
// keep no locator alive, and are dropped with it; any other callback as itself (owned), asked_self nullptr.
PyObject* asked_fn = nullptr;
PyObject* asked_self = nullptr;
int64_t epoch = 0;
unsigned long main_ident = 0;  // the main thread's (threading.main_thread().ident)
// Never freed (the core outlives the interpreter's teardown); code objects held while cached, so no pointer is reused.
auto& roles = *new std::unordered_map<PyObject*, int>();
auto& tallies = *new std::unordered_map<Line, Tally, LineHash>();

int role_of(PyObject* code) {
  auto it = roles.find(code);
  if (it != roles.end()) return it->second;
  const int64_t asked = epoch;
  PyObject* got = PyObject_CallOneArg(roles_fn, code);
  if (got == nullptr) throw pybind11::error_already_set();
  long role = PyLong_AsLong(got);
  Py_DECREF(got);
  if (role == -1 && PyErr_Occurred()) throw pybind11::error_already_set();
  if (asked != epoch) return static_cast<int>(role);  // another thread set new roles meanwhile: not cached in theirs
  Py_INCREF(code);
  roles.emplace(code, static_cast<int>(role));
  return static_cast<int>(role);
}

enum Walked { kFound, kNone, kAsked };

// From `frame` (a new reference, taken) outwards: the user's frame, and the innermost library frame if `line` has none.
Walked walk(PyFrameObject* frame, Line* line) {
  Walked found = kNone;
  while (frame != nullptr) {
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame));
    int role;
    try {
      role = role_of(code);
    } catch (...) {
      Py_DECREF(code);
      Py_DECREF(frame);
      throw;
    }
    Py_DECREF(code);  // the roles cache holds it
    if (role == kAsk) {
      found = kAsked;
      break;
    }
    if (role == kUser) {
      line->user = code;
      line->user_at = PyFrame_GetLasti(frame);
      found = kFound;
      break;
    }
    if (role == kLibrary && line->library == nullptr) {
      line->library = code;
      line->library_at = PyFrame_GetLasti(frame);
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return found;
}

PyThreadState* main_thread() {
  for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); t; t = PyThreadState_Next(t)) {
    if (t->thread_id == main_ident) return t;
  }
  return nullptr;
}

// From `frame` (a new reference, taken) outwards, every frame: its code (borrowed: the running frame holds it) and
// offset.
void append_frames(PyFrameObject* frame, Frames* out) {
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    out->emplace_back(reinterpret_cast<PyObject*>(code), PyFrame_GetLasti(frame));
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
}

// This call's frames: a superset of what the subscriber's stack of it reads (autograd's thread takes the main thread's).
Frames frames_here() {
  Frames out;
  PyThreadState* self = PyThreadState_Get();
  append_frames(PyThreadState_GetFrame(self), &out);
  if (self->thread_id != main_ident) {
    if (PyThreadState* main = main_thread()) append_frames(PyThreadState_GetFrame(main), &out);
  }
  return out;
}

// Whether `callback` is the one the cached roles came from (a bound method: the same function of the same object).
bool asked_of(PyObject* callback) {
  if (asked_fn == nullptr) return false;
  if (!PyMethod_Check(callback)) return asked_self == nullptr && callback == asked_fn;
  return asked_self != nullptr && PyMethod_GET_FUNCTION(callback) == asked_fn &&
         PyWeakref_GetObject(asked_self) == PyMethod_GET_SELF(callback);
}

// The cached roles and the callback they came from, unlinked (released by the caller: a release may run Python code).
struct Asked {
  std::unordered_map<PyObject*, int> roles;
  PyObject* fn = nullptr;
  PyObject* self = nullptr;
  void release() {
    for (auto& [code, _] : roles) Py_DECREF(code);
    Py_XDECREF(fn);
    Py_XDECREF(self);
  }
};

Asked unlink_asked() {
  Asked out{std::move(roles), asked_fn, asked_self};
  roles.clear();
  asked_fn = asked_self = nullptr;
  return out;
}

// The object of the callback the roles came from is gone (the session's locator, after %unload_ext): so are its roles.
PyObject* forget_asked(PyObject*, PyObject* ref) {
  if (ref == asked_self) unlink_asked().release();  // nothing after: the release may free `ref`
  Py_RETURN_NONE;
}

PyMethodDef forget_def = {"forget_roles", forget_asked, METH_O, nullptr};

// Remember `callback` as the one the roles are asked of: a bound method weakly through its object where the object
// allows weak references (else, as any other callback, strongly).
void ask_of(PyObject* callback) {
  if (PyMethod_Check(callback)) {
    static PyObject* forget = PyCFunction_New(&forget_def, nullptr);  // never released, as the maps above
    PyObject* ref = PyWeakref_NewRef(PyMethod_GET_SELF(callback), forget);
    if (ref != nullptr) {
      asked_self = ref;
      asked_fn = Py_NewRef(PyMethod_GET_FUNCTION(callback));
      return;
    }
    PyErr_Clear();
  }
  asked_fn = Py_NewRef(callback);
}

}  // namespace

bool line_of(const void* op, int kind, Line* line) {
  if (!((lined >> kind) & 1) || roles_fn == nullptr) return false;
  *line = Line{op, kind};
  line->epoch = epoch;
  PyThreadState* self = PyThreadState_Get();
  Walked w = walk(PyThreadState_GetFrame(self), line);
  if (w != kNone || self->thread_id == main_ident) return w == kFound;
  // Autograd's device threads run no user code: the call was caused by the line the main thread waits on.
  PyThreadState* main = main_thread();
  return main != nullptr && walk(PyThreadState_GetFrame(main), line) == kFound;
}

bool count_at(const Line& line, int64_t host_ns, Frames* frames) {
  auto it = tallies.find(line);
  if (it == tallies.end()) return false;
  Tally& t = it->second;
  if (t.stack_calls > 0) {
    Frames here = frames_here();
    if (std::find(t.seen.begin(), t.seen.end(), here) == t.seen.end()) {
      *frames = std::move(here);
      return false;
    }
    t.stack_calls -= 1;
  }
  t.calls += 1;
  t.host_ns += host_ns;
  return true;
}

void keep_tally(const Line& line, PyObject* tally, int stack_calls, Frames frames) {
  if (line.epoch != epoch) return;  // the roles changed while the subscriber ran
  auto it = tallies.find(line);
  if (it == tallies.end()) {
    it = tallies.emplace(line, Tally{tally}).first;
    Py_INCREF(tally);
    it->second.stack_calls = stack_calls;
    if (stack_calls > 0) frames = frames_here();
  } else if (!frames.empty()) {
    it->second.stack_calls -= 1;  // a call with new frames, handed to the subscriber
  }
  if (!frames.empty() && it->second.stack_calls > 0) {
    for (const auto& [code, _] : frames) Py_INCREF(code);
    it->second.seen.push_back(std::move(frames));
  }
}

std::vector<Counted> take_counts() {
  std::vector<Counted> out;
  for (auto& [line, t] : tallies) {
    if (t.calls == 0) continue;
    Py_INCREF(t.fn);
    out.push_back({t.fn, t.calls, t.host_ns});
    t.calls = t.host_ns = 0;
  }
  return out;
}

void set_lines(int kinds_mask, PyObject* roles_callback, unsigned long main_thread) {
  main_ident = main_thread;
  // Roles asked of the same callback (a session's locator, cell after cell) still hold: kept, as they are between
  // subscribers (until the callback's object goes); another callback's are dropped.
  // Unlinked first, released after: a release may run Python code, which may deliver a call.
  auto old_tallies = std::move(tallies);
  tallies.clear();
  Asked old;
  if (roles_callback != nullptr && !asked_of(roles_callback)) {
    old = unlink_asked();
    ask_of(roles_callback);
  }
  PyObject* old_fn = roles_fn;
  Py_XINCREF(roles_callback);
  roles_fn = roles_callback;
  lined = roles_callback == nullptr ? 0 : kinds_mask;
  epoch += 1;
  for (auto& [_, t] : old_tallies) release(t);
  old.release();
  Py_XDECREF(old_fn);
}
}  // namespace neuron_lab
