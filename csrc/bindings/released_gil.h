// gpupipe's calls on other threads, and the interpreter's exit while one is running.
//
// A daemon thread still inside a native call when Python exits would, on return, ask a finalizing
// interpreter for the GIL. CPython before 3.14 then ends the thread with pthread_exit, whose forced
// unwind through a noexcept destructor (py::gil_scoped_release's, torch's) is std::terminate: the
// process aborts ("terminate called without an active exception"), and the call's pool threads could
// meanwhile write into buffers that finalization frees. So:
// - a gpupipe call (an entry point of the Python API, one item of a Loader stage: Python's
//   gpupipe._exit.call_scope; a GIL-free region of the bindings: ReleasedGil) is counted while it runs;
// - an atexit hook, registered at import (it runs before finalization starts), calls
//   wait_for_calls(): the calls running on other threads finish before finalization begins, torch
//   ops between their native parts included, and their threads then park for good, GIL released,
//   instead of returning to code that would drop the call's tensors (torch ops too). So does such a
//   thread that starts a new call meanwhile. These are the threads alive when the hook ran, daemon
//   threads of an exiting interpreter (the others were joined before atexit): Python would stop them
//   at their next GIL request, CPython 3.14 parks them the same way. Threads started later, by an
//   atexit handler that runs after this one, are not touched. Nothing is said on stderr;
// - a call still running after the wait is abandoned: when its native part ends, its thread parks
//   instead of asking for the GIL, and the process's exit ends it.
#pragma once

#include <pybind11/pybind11.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <vector>

namespace gpupipe {

class CallScope {
 public:
  // Counts the calling thread's outermost call; parks the thread when the interpreter is exiting on
  // another thread. Called with the GIL held.
  CallScope() { enter(); }
  ~CallScope() { leave(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  static void enter() {
    if (depth()++ > 0) return;
    State& s = state();
    bool stop;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      stop = s.parks_this_thread();
      if (!stop) ++s.running;
    }
    if (stop) park_released();
  }

  // Ends the thread's outermost call. When the interpreter is exiting on another thread, the thread
  // parks here (GIL released) instead of returning: back in the caller's code it would drop the
  // call's tensors, torch ops that abort in a finalizing interpreter. Called with the GIL held.
  static void leave() {
    if (--depth() > 0) return;
    State& s = state();
    bool stop;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      --s.running;
      stop = s.parks_this_thread();
    }
    s.changed.notify_all();
    if (stop) park_released();
  }

  // Whether the thread of this native id (threading.Thread.native_id) is parked for good
  // (gpupipe._exit: never join it, never wait for it).
  static bool parked(unsigned long native_id) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return std::find(s.parked_now.begin(), s.parked_now.end(), native_id) != s.parked_now.end();
  }

  // A call that runs on the pool without its caller (a started batch decode): counted from start()
  // until its pool thread calls end_detached(), so that exit waits for it too. start() is called
  // with the GIL held, end_detached() from any thread.
  static void start_detached() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.running;
  }
  static void end_detached() {
    State& s = state();
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      --s.running;
    }
    s.changed.notify_all();
  }

  // The atexit hook: stops new calls from other threads, waits up to `seconds` for the running ones
  // to end, then abandons the rest. Called with the GIL held, which it lends out while waiting.
  static void wait_for_calls(double seconds) {
    State& s = state();
    // The native id (the kernel's thread id) of every thread alive now but this one: not
    // threading.get_ident(), which glibc gives the next thread as soon as one exits (a thread
    // started after the hook would then park as if it had been alive).
    std::vector<unsigned long> alive;
    for (pybind11::handle t : pybind11::module_::import("threading").attr("enumerate")()) {
      pybind11::object id = t.attr("native_id");
      if (!id.is_none() && id.cast<unsigned long>() != PyThread_get_thread_native_id())
        alive.push_back(id.cast<unsigned long>());
    }
    std::sort(alive.begin(), alive.end());
    pybind11::gil_scoped_release release;  // the exiting thread: the interpreter is not finalizing yet
    std::unique_lock<std::mutex> lock(s.mutex);
    s.closing = true;
    s.parked = std::move(alive);
    if (!s.changed.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return s.running == 0; })) {
      s.abandoned = true;
      s.changed.wait(lock, [&] { return s.restoring == 0; });  // those already asking get the GIL first
    }
  }

  // Whether the exit hook has run: a thread alive then that starts or ends a call parks.
  static bool exiting() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.closing;
  }

  // gpupipe calls running now, on any thread (a test hook).
  static int running() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.running;
  }

 protected:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    int running = 0;    // threads inside a call
    int restoring = 0;  // threads whose native part ended, asking for the GIL back
    bool closing = false;
    bool abandoned = false;
    std::vector<unsigned long> parked;      // sorted native ids of the threads alive when the exit hook ran
    std::vector<unsigned long> parked_now;  // those that have parked

    bool parks_this_thread() const {  // with mutex held
      return closing && std::binary_search(parked.begin(), parked.end(), PyThread_get_thread_native_id());
    }
  };

  // Never destroyed (threads may use it during exit). A forked child starts with no calls and no exit
  // in progress: the calls belonged to threads fork did not copy.
  static State& state() {
    static State* s = [] {
      pthread_atfork([] { state().mutex.lock(); }, [] { state().mutex.unlock(); },
                     [] {
                       State& c = state();
                       c.running = c.restoring = 0;
                       c.closing = c.abandoned = false;
                       c.parked.clear();
                       c.parked_now.clear();
                       c.mutex.unlock();
                     });
      return new State();
    }();
    return *s;
  }

  static int& depth() {
    thread_local int d = 0;  // nested scopes of this thread (an API call's native parts)
    return d;
  }

  [[noreturn]] static void park() {
    for (;;) pause();
  }

  [[noreturn]] static void park_released() {  // with the GIL held: recorded, released, parked
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mutex);
      s.parked_now.push_back(PyThread_get_thread_native_id());
    }
    PyEval_SaveThread();
    park();
  }
};

// py::gil_scoped_release for the bindings' GIL-free regions, inside a CallScope. The CPU time the
// calling thread spends in the region adds to its native_cpu_seconds(): a Loader stage thread's CPU
// time less that is its host time (Python, torch ops), what the decode pool does not do.
class ReleasedGil : CallScope {
 public:
  ReleasedGil() : saved_(PyEval_SaveThread()), start_(thread_cpu_seconds()) {}

  // CPU seconds this thread has spent in GIL-free regions of the bindings.
  static double native_cpu_seconds() { return native_cpu(); }

  ~ReleasedGil() {
    native_cpu() += thread_cpu_seconds() - start_;
    State& s = state();
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      if (s.abandoned) {
        lock.unlock();
        park();
      }
      ++s.restoring;
    }
    PyEval_RestoreThread(saved_);  // a running call holds the exit hook back: not finalizing yet
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      --s.restoring;
    }
    s.changed.notify_all();
  }  // then ~CallScope

 private:
  static double& native_cpu() {
    thread_local double t = 0;
    return t;
  }

  static double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

  PyThreadState* saved_;
  double start_;
};

}  // namespace gpupipe
