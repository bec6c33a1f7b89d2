// storage._lock: a reentrant lock whose state is read and written only with the GIL held.
//
// Why: the storage table and its byte counts change in two places, C++ (a new tensor's entry,
// a dead storage's release: once each per strict op) and short Python sections (`with _lock:`)
// that the interpreter may switch threads in the middle of. A threading.RLock served both, at
// four Python calls per strict op from C++ (acquire and release, twice; ~3 % of a 16x16 add in
// perf). Every taker holds the GIL while it takes or gives this lock, so its owner and count
// need no atomics: taking it when free or already ours is two stores. A thread finding it held
// by another gives up the GIL and yields until the owner (a Python section that was switched
// out, never one that blocks) gives it back. C++ sections under it make no Python calls.
//
// GilLock() -> lock, with acquire(blocking=True, timeout=-1), release(), __enter__, __exit__
// and _is_owned() as threading.RLock's.
#pragma once

#include <pythread.h>

#include <thread>

// (included once, by hit.cpp, before its own anonymous namespace)
namespace {

struct GilLockObject {
  PyObject_HEAD
  unsigned long owner;
  long count;
};

PyTypeObject GilLockType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// the lock taken by this thread (the GIL held on entry and on return)
void gil_lock_take(GilLockObject* l) {
  const unsigned long me = PyThread_get_thread_ident();
  while (l->count > 0 && l->owner != me) {
    Py_BEGIN_ALLOW_THREADS
    std::this_thread::yield();
    Py_END_ALLOW_THREADS
  }
  l->owner = me;
  ++l->count;
}

// false with a RuntimeError set where this thread does not hold it
bool gil_lock_give(GilLockObject* l) {
  if (l->count == 0 || l->owner != PyThread_get_thread_ident()) {
    PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
    return false;
  }
  if (--l->count == 0) l->owner = 0;
  return true;
}

PyObject* gil_lock_acquire(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"blocking", "timeout", nullptr};
  int blocking = 1;
  double timeout = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:acquire", const_cast<char**>(names), &blocking, &timeout))
    return nullptr;
  auto* l = reinterpret_cast<GilLockObject*>(self);
  if (!blocking && l->count > 0 && l->owner != PyThread_get_thread_ident()) Py_RETURN_FALSE;
  // (a timeout is not kept: the sections under this lock are a few dict updates)
  gil_lock_take(l);
  Py_RETURN_TRUE;
}

PyObject* gil_lock_enter(PyObject* self, PyObject*) {
  gil_lock_take(reinterpret_cast<GilLockObject*>(self));
  Py_RETURN_TRUE;
}

PyObject* gil_lock_release(PyObject* self, PyObject*) {
  if (!gil_lock_give(reinterpret_cast<GilLockObject*>(self))) return nullptr;
  Py_RETURN_NONE;
}

PyObject* gil_lock_exit(PyObject* self, PyObject* const*, Py_ssize_t) {
  return gil_lock_release(self, nullptr);
}

PyObject* gil_lock_is_owned(PyObject* self, PyObject*) {
  auto* l = reinterpret_cast<GilLockObject*>(self);
  return PyBool_FromLong(l->count > 0 && l->owner == PyThread_get_thread_ident());
}

PyMethodDef gil_lock_methods[] = {
    {"acquire", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gil_lock_acquire)),
     METH_VARARGS | METH_KEYWORDS, "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", gil_lock_release, METH_NOARGS, "release()"},
    {"__enter__", gil_lock_enter, METH_NOARGS, "acquire()"},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gil_lock_exit)), METH_FASTCALL,
     "release()"},
    {"_is_owned", gil_lock_is_owned, METH_NOARGS, "whether this thread holds it"},
    {nullptr, nullptr, 0, nullptr}};

PyObject* gil_lock_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
    PyErr_SetString(PyExc_TypeError, "GilLock() takes no arguments");
    return nullptr;
  }
  PyObject* self = type->tp_alloc(type, 0);  // (zeroed: free)
  return self;
}

int gil_lock_type_init() {
  GilLockType.tp_name = "torchtpu.runtime._hit.GilLock";
  GilLockType.tp_basicsize = sizeof(GilLockObject);
  GilLockType.tp_flags = Py_TPFLAGS_DEFAULT;
  GilLockType.tp_doc = "A reentrant lock for sections run with the GIL held (csrc/gil_lock.h)";
  GilLockType.tp_methods = gil_lock_methods;
  GilLockType.tp_new = gil_lock_new;
  return PyType_Ready(&GilLockType);
}

}  // namespace
