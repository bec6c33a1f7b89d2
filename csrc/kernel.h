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
//     then fast(state, args, kwargs); where that answers NotImplemented, `after(*args, **kwargs)`
//     (the executor's full path); where it raises `first_seen` (carried.FirstSeen: the call was
//     the process's first to name a carried dtype), `full` serves it again, as the Python kernel's
//     own handler does.
#pragma once

// (included inside hit.cpp's anonymous namespace)
namespace {

struct KernelObject {
  PyObject_HEAD
  PyObject* state;
  PyObject* check;
  PyObject* after;
  PyObject* full;
  PyObject* first_seen;
};

PyObject* kernel_call(PyObject* self_, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<KernelObject*>(self_);
  if (!gate.quick || cell(gate.carried_seen)) return PyObject_Call(self->full, args, kwargs);
  if (self->check != Py_None) {
    PyObject* r = PyObject_Call(self->check, args, kwargs);
    if (!r) return nullptr;
    Py_DECREF(r);
  }
  // (the Python paths take a dict: PyObject_Call may pass none)
  PyObject* kw = kwargs ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
  if (!kw) return nullptr;
  PyObject* argv[] = {self->state, args, kw};
  PyObject* res = fast(nullptr, argv, 3);
  Py_DECREF(kw);
  if (!res) {
    if (!PyErr_ExceptionMatches(self->first_seen)) return nullptr;
    PyErr_Clear();
    return PyObject_Call(self->full, args, kwargs);
  }
  if (res != Py_NotImplemented) return res;
  Py_DECREF(res);
  return PyObject_Call(self->after, args, kwargs);
}

int kernel_traverse(PyObject* self_, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<KernelObject*>(self_);
  Py_VISIT(self->state);
  Py_VISIT(self->check);
  Py_VISIT(self->after);
  Py_VISIT(self->full);
  Py_VISIT(self->first_seen);
  return 0;
}

int kernel_clear(PyObject* self_) {
  auto* self = reinterpret_cast<KernelObject*>(self_);
  Py_CLEAR(self->state);
  Py_CLEAR(self->check);
  Py_CLEAR(self->after);
  Py_CLEAR(self->full);
  Py_CLEAR(self->first_seen);
  return 0;
}

void kernel_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  kernel_clear(self);
  Py_TYPE(self)->tp_free(self);
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
  auto* self = reinterpret_cast<KernelObject*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  PyObject* values[] = {state, check, after, full, first_seen};
  PyObject** slots[] = {&self->state, &self->check, &self->after, &self->full, &self->first_seen};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(values[i]);
    *slots[i] = values[i];
  }
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject KernelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// the type, readied once (PyInit__hit); -1 with an error set
int kernel_type_init() {
  KernelType.tp_name = "torchtpu.runtime._hit.Kernel";
  KernelType.tp_basicsize = sizeof(KernelObject);
  KernelType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  KernelType.tp_doc = "An op's tpu kernel: fast() in C++, the Python paths where it hands the call back (csrc/kernel.h)";
  KernelType.tp_new = kernel_new;
  KernelType.tp_call = kernel_call;
  KernelType.tp_traverse = kernel_traverse;
  KernelType.tp_clear = kernel_clear;
  KernelType.tp_dealloc = kernel_dealloc;
  return PyType_Ready(&KernelType);
}

}  // namespace
