// An ATen op's PrivateUse1 kernel as a C++ callable: PyTorch's dispatcher calls the kernel
// registered for the op with (args, kwargs), and a Python function there cost a frame, its
// argument repacking and a call into fast() (~0.6 us of a ~10 us strict add here, as much of a
// defer_and_fuse record's whole margin over PJRT's dispatch floor). Included once, by hit.cpp,
// after fast().
//
// Kernel(state, check, after, full, first_seen), called as the op's kernel:
//   - a carried dtype seen in the process (complex32, uint4: eager/carried.py): `full`, the
//     Python kernel eager/kernels.py would have registered, serves the call whole;
//   - else `check(*args, **kwargs)` when not None (what CPU rejects from the tensors' geometry),
//     then fast(state, args, kwargs); where that answers NotImplemented, `after(args, kwargs)`
//     (the executor's full path: functools.partial(executor.execute, low)). Where either raises
//     `first_seen` (carried.FirstSeen: the call was the process's first to name a carried
//     dtype, which it has marked seen), `full` serves it again, as the Python kernel's own
//     handler does.
#pragma once

// (included inside hit.cpp's anonymous namespace)
namespace {

// (its items, csrc/held.h)
enum { kState, kCheck, kAfter, kFull, kFirstSeen, kItems };

PyObject* kernel_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* full = held_item(self, kFull);
  if (!gate.quick || cell(gate.carried_seen)) return PyObject_Call(full, args, kwargs);
  PyObject* check = held_item(self, kCheck);
  if (check != Py_None) {
    PyObject* r = PyObject_Call(check, args, kwargs);
    if (!r) return nullptr;
    Py_DECREF(r);
  }
  // (the Python paths take a dict: PyObject_Call may pass none)
  PyObject* kw = kwargs ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
  if (!kw) return nullptr;
  PyObject* argv[] = {held_item(self, kState), args, kw};
  PyObject* res = fast(nullptr, argv, 3);
  if (res == Py_NotImplemented) {
    Py_DECREF(res);
    res = PyObject_CallFunctionObjArgs(held_item(self, kAfter), args, kw, nullptr);
  }
  Py_DECREF(kw);
  if (res || !PyErr_ExceptionMatches(held_item(self, kFirstSeen))) return res;
  PyErr_Clear();
  return PyObject_Call(full, args, kwargs);
}

PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *state, *check, *after, *full, *first_seen;
  if (kwargs && PyDict_GET_SIZE(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "Kernel(state, check, after, full, first_seen) takes no keywords");
    return nullptr;
  }
  if (!PyArg_UnpackTuple(args, "Kernel", 5, 5, &state, &check, &after, &full, &first_seen)) return nullptr;
  if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 4 || !PyCallable_Check(after) ||
      !PyCallable_Check(full) || (check != Py_None && !PyCallable_Check(check)) ||
      !PyExceptionClass_Check(first_seen)) {
    PyErr_SetString(PyExc_TypeError,
                    "Kernel(state, check, after, full, first_seen): fast()'s state, a callable or None, two "
                    "callables, an exception class");
    return nullptr;
  }
  return new_held(*type, {state, check, after, full, first_seen});
}

PyTypeObject KernelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// the type, readied once (PyInit__hit); -1 with an error set
int kernel_type_init() {
  return ready_held_type(KernelType, "torchtpu.runtime._hit.Kernel", kItems,
                         "An op's tpu kernel: fast() in C++, the Python paths where it hands the call back "
                         "(csrc/kernel.h)",
                         kernel_call, kernel_new);
}

}  // namespace
