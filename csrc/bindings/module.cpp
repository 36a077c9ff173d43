// The entry point of gpupipe._C: the module's lifecycle hooks (calls on other threads at exit,
// released_gil.h) and the registration of each topic's bindings (bindings.h).
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "bindings/released_gil.h"

namespace py = pybind11;
using namespace gpupipe;

namespace {

// How long an exiting interpreter waits for native calls still running on other threads (a batch
// decode takes well under a second; a read stuck on a dead network file system is then abandoned).
constexpr double kExitWaitSeconds = 30.0;

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpupipe's C++ core (libjpeg-turbo ROI decoding, batch engine). Private: use gpupipe.";
  // Before finalization starts, gpupipe calls running on other threads finish (released_gil.h).
  py::module_::import("atexit").attr("register")(py::cpp_function([] { CallScope::wait_for_calls(kExitWaitSeconds); }));
  // `with _C.CallScope():` around a gpupipe call of this thread (gpupipe._exit). A C++ context
  // manager: no Python bytecode runs between the count and the block, so a KeyboardInterrupt cannot
  // leave a call counted (exit would then wait for it), and no frame is added to warnings' stacks.
  struct CallScopeContext {};
  py::class_<CallScopeContext>(m, "CallScope")
      .def(py::init<>())
      .def("__enter__", [](CallScopeContext&) { CallScope::enter(); })
      .def("__exit__", [](CallScopeContext&, py::args) {
        CallScope::leave();
        return false;
      });
  m.def("_thread_parked", &CallScope::parked, py::arg("native_id"),
        "Whether the thread of this native id (threading.Thread.native_id) has parked for good at exit "
        "(never join it).");
  m.def("_interpreter_exiting", &CallScope::exiting,
        "Whether gpupipe's exit hook has run (threads alive then park at their next gpupipe call).");
  m.def("_calls_running", &CallScope::running, "gpupipe calls running now, on any thread (a test hook).");
  m.def("_thread_native_cpu_seconds", &ReleasedGil::native_cpu_seconds,
        "CPU seconds the calling thread has spent in gpupipe's native calls without the GIL.");
  register_errors(m);
  register_header(m);
  register_files(m);
  register_decode(m);
  register_crop_resize(m);
  register_routes(m);
  register_runtime(m);
  register_encode(m);
  register_augment(m);
  register_restarts(m);
  register_policies(m);
}
