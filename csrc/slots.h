// Instances of our small __slots__ classes made from C++ without running their __init__
// (which only stores its arguments): the instance allocated and its slots written at their
// offsets, as the slots' member descriptors would. A Python __init__ call is ~0.3 us, as
// much as the rest of what makes a recorded node or a storage entry. The slots are checked
// against the expected names when configured, so a class whose slots change fails at import,
// not with a half-made object. Included once, by hit.cpp, inside its anonymous namespace.
#pragma once

namespace {

struct SlotMaker {
  PyTypeObject* type = nullptr;
  std::vector<Py_ssize_t> offsets;  // of the object slots, in the order of `names`
};

// Reads `type`'s slots, which must be exactly `names` (in order; "__weakref__" is allowed and
// skipped: it is not an object slot); false with an error set
bool slot_maker(PyObject* type, std::initializer_list<const char*> names, SlotMaker& out) {
  if (!PyType_Check(type)) {
    PyErr_SetString(PyExc_TypeError, "slot_maker: a class expected");
    return false;
  }
  PyObject* slots = PyObject_GetAttrString(type, "__slots__");
  if (!slots) return false;
  bool same = PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) == static_cast<Py_ssize_t>(names.size());
  std::vector<Py_ssize_t> offsets;
  Py_ssize_t i = 0;
  for (const char* name : names) {
    if (!same) break;
    PyObject* slot = PyTuple_GET_ITEM(slots, i++);
    same = PyUnicode_Check(slot) && PyUnicode_CompareWithASCIIString(slot, name) == 0;
    if (!same || std::string(name) == "__weakref__") continue;
    PyObject* d = PyDict_GetItemString(reinterpret_cast<PyTypeObject*>(type)->tp_dict, name);
    same = d && Py_TYPE(d) == &PyMemberDescr_Type &&
           reinterpret_cast<PyMemberDescrObject*>(d)->d_member->type == T_OBJECT_EX;
    if (same) offsets.push_back(reinterpret_cast<PyMemberDescrObject*>(d)->d_member->offset);
  }
  Py_DECREF(slots);
  if (!same) {
    PyErr_Format(PyExc_TypeError, "%s's __slots__ are not the ones csrc/hit.cpp fills",
                 reinterpret_cast<PyTypeObject*>(type)->tp_name);
    return false;
  }
  Py_INCREF(type);
  Py_XDECREF(reinterpret_cast<PyObject*>(out.type));
  out.type = reinterpret_cast<PyTypeObject*>(type);
  out.offsets = std::move(offsets);
  return true;
}

// off the cyclic GC's lists (record.h says when that is safe)
void untrack(PyObject* o) {
  if (PyObject_IS_GC(o)) PyObject_GC_UnTrack(o);
}

// A new instance with its object slots set to `values` (one per slot, in order); off the
// cyclic GC's lists unless `tracked` (record.h says when that is safe); nullptr on error
PyObject* make_slotted(const SlotMaker& m, PyObject* const* values, bool tracked) {
  PyObject* o = m.type->tp_alloc(m.type, 0);
  if (!o) return nullptr;
  if (!tracked) untrack(o);
  for (size_t i = 0; i < m.offsets.size(); ++i) {
    Py_INCREF(values[i]);
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + m.offsets[i]) = values[i];
  }
  return o;
}

}  // namespace
