// Small C++ types whose instances hold a fixed number of object references: a storage's
// release (hit.cpp's Release, a DataPtr's context) and an op's kernel (kernel.h, callable).
// One layout, traversal, clearing and deallocation serves both; each type says its count and
// its call (none: not callable).
// Included once, by hit.cpp, inside its anonymous namespace.
#pragma once

#include <cstddef>
#include <initializer_list>

namespace {

struct Held {
  PyObject_HEAD
  PyObject* items[1];  // (tp_basicsize makes room for the type's count)
};

Py_ssize_t held_count(PyObject* self) {
  return (Py_TYPE(self)->tp_basicsize - static_cast<Py_ssize_t>(offsetof(Held, items))) /
         static_cast<Py_ssize_t>(sizeof(PyObject*));
}

PyObject* held_item(PyObject* self, int i) { return reinterpret_cast<Held*>(self)->items[i]; }

int held_traverse(PyObject* self, visitproc visit, void* arg) {
  for (Py_ssize_t i = 0; i < held_count(self); ++i) Py_VISIT(reinterpret_cast<Held*>(self)->items[i]);
  return 0;
}

int held_clear(PyObject* self) {
  for (Py_ssize_t i = 0; i < held_count(self); ++i) Py_CLEAR(reinterpret_cast<Held*>(self)->items[i]);
  return 0;
}

void held_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  held_clear(self);
  Py_TYPE(self)->tp_free(self);
}

// `type` readied as a GC-tracked callable holding `count` references; -1 with an error set
int ready_held_type(PyTypeObject& type, const char* name, int count, const char* doc, ternaryfunc call,
                    newfunc make = nullptr) {
  type.tp_name = name;
  type.tp_basicsize = static_cast<Py_ssize_t>(offsetof(Held, items) + count * sizeof(PyObject*));
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  type.tp_doc = doc;
  type.tp_call = call;
  type.tp_new = make;
  type.tp_traverse = held_traverse;
  type.tp_clear = held_clear;
  type.tp_dealloc = held_dealloc;
  return PyType_Ready(&type);
}

// a new instance of `type` holding `values` (as many as the type holds), or nullptr
PyObject* new_held(PyTypeObject& type, std::initializer_list<PyObject*> values) {
  PyObject* self = type.tp_alloc(&type, 0);  // (PyType_GenericAlloc: zeroed, tracked by the GC)
  if (!self) return nullptr;
  int i = 0;
  for (PyObject* v : values) {
    Py_INCREF(v);
    reinterpret_cast<Held*>(self)->items[i++] = v;
  }
  return self;
}

}  // namespace
