// The PrivateUse1 device guard, in C++ so that it never enters Python.
//
// The guard a Python backend can register (torch._C._acc.DeviceGuard) answers type() by
// calling a Python method. C++ calls the guard from destructors and noexcept paths: the
// autograd engine restores the stream of every backward node it ran through an
// InlineStreamGuard, and when a node's kernel raised a Python exception that guard's
// destructor runs while the exception is still set on the thread. Calling into Python then
// fails ("returned a result with an exception set"), the failure becomes a C++ exception
// inside a noexcept function, and the process aborts ("terminate called without an active
// exception") instead of the user seeing their error. torch.compile met this whenever a
// backward traced with fake tensors raised (kosmos-2: a data-dependent boolean index).
//
// Devices: as CUDA's guard, a current device per thread (the autograd engine's worker for
// device i sets i on its own thread) and a device count. The count is 1 until torchtpu has
// asked JAX for its local devices (runtime/placement.py calls set_count): JAX must not be
// started from here, since a distributed run must bring its runtime up before JAX starts.
// Each device's only stream is the default one; events and stream queries are already
// complete (the device's Stream/Event semantics live in torchtpu/device/streams.py and
// events.py, which order work by computing pending values, not through this guard).
// Loading this module registers the guard; device/lazy.py loads it before naming the device,
// so PyTorch's registration of the Python guard is then a no-op.
#include <Python.h>

#include <torch/csrc/Exceptions.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <ATen/ATen.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <vector>

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

// -1 until the thread sets one: then the process's default (0, or the one chip a torchrun
// process was given, runtime/launch.py)
thread_local c10::DeviceIndex thread_index = -1;
std::atomic<c10::DeviceIndex> default_index{0};
std::atomic<c10::DeviceIndex> device_count{1};

c10::DeviceIndex current_index() { return thread_index >= 0 ? thread_index : default_index.load(); }

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static c10::Device current() { return c10::Device(kType, current_index()); }
  // a device without an index (torch.Stream(device="tpu")) means the current one, as CUDA's
  // stream getters read it
  static c10::Stream stream(c10::Device d) {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, d.index() >= 0 ? d.index() : current_index()));
  }
  static void set(c10::Device d) {
    if (d.index() >= 0) thread_index = d.index();
  }

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = current();
    set(d);
    return old;
  }
  c10::Device getDevice() const override { return current(); }
  void setDevice(c10::Device d) const override { set(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { set(d); }
  c10::Stream getStream(c10::Device d) const noexcept override { return stream(d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return stream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return stream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return stream(d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return stream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count.load(); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

PyObject* set_count(PyObject*, PyObject* arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  device_count.store(static_cast<c10::DeviceIndex>(n));
  Py_RETURN_NONE;
}

PyObject* get_current(PyObject*, PyObject*) { return PyLong_FromLong(current_index()); }

PyObject* set_current(PyObject*, PyObject* arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  thread_index = static_cast<c10::DeviceIndex>(n);
  Py_RETURN_NONE;
}

PyObject* set_default(PyObject*, PyObject* arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  default_index.store(static_cast<c10::DeviceIndex>(n));
  Py_RETURN_NONE;
}

// A tpu tensor of `shape` and `dtype` on device `index`, contiguous, over a zero-byte
// storage (its data is a JAX buffer, runtime/storage.py). PyTorch's own helper
// (torch._C._acc.create_empty_tensor) always makes it on device 0.
PyObject* create_empty(PyObject*, PyObject* args) {
  PyObject* shape_obj;
  PyObject* dtype_obj;
  long index;
  if (!PyArg_ParseTuple(args, "OOl", &shape_obj, &dtype_obj, &index)) return nullptr;
  if (!THPDtype_Check(dtype_obj)) {
    PyErr_SetString(PyExc_TypeError, "create_empty: expected a torch.dtype");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(shape_obj, "create_empty: expected a sequence of sizes");
  if (!seq) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<int64_t> sizes(n), strides(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    sizes[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return nullptr;
  int64_t step = 1;
  for (Py_ssize_t i = n; i > 0; --i) {
    strides[i - 1] = step;
    step *= sizes[i - 1];
  }
  HANDLE_TH_ERRORS
  c10::Storage storage(c10::Storage::use_byte_size_t{}, 0, c10::GetAllocator(c10::kMeta), true);
  storage.set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(kType, static_cast<c10::DeviceIndex>(index))));
  auto dtype = reinterpret_cast<THPDtype*>(dtype_obj)->scalar_type;
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, 0);
  return THPVariable_Wrap(std::move(t));
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"create_empty", create_empty, METH_VARARGS, "An empty tpu tensor on a given device index."},
    {"set_count", set_count, METH_O, "Set the number of devices the guard reports."},
    {"current", get_current, METH_NOARGS, "This thread's current device index."},
    {"set_current", set_current, METH_O, "Set this thread's current device index."},
    {"set_default", set_default, METH_O, "Set the current device index of threads that set none."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_device_guard", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__device_guard(void) {
  // Once per process (the registry keeps the first guard; PyTorch asks for it by type).
  if (!c10::impl::hasDeviceGuardImpl(kType)) {
    static TpuGuardImpl impl;
    c10::impl::registerDeviceGuard(kType, &impl);
  }
  return PyModule_Create(&module_def);
}
