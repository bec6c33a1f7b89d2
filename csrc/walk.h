// The walk over an op call's arguments that makes its quick key: shared by csrc/scan.cpp
// (the key for the Python executor) and csrc/hit.cpp (the key and the hit in one call).
// Included once per extension (its functions are internal to each).
#pragma once
#include <Python.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/ATen.h>

#include <vector>

namespace {


PyObject* s_numel = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_buf = nullptr;

struct Walk {
  PyObject* table;
  PyObject* entries;
  PyObject* offsets;
  PyObject* dyn;
  PyObject* tensors;
  std::vector<PyObject*> seen;  // entries, by slot (borrowed: `entries` holds them)
};

// a new reference to a tuple of the ints, or nullptr
PyObject* int_tuple(c10::IntArrayRef xs) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(xs.size()));
  if (!t) return nullptr;
  for (size_t i = 0; i < xs.size(); ++i) {
    PyObject* v = PyLong_FromLongLong(xs[i]);
    if (!v) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), v);
  }
  return t;
}

// Each returns a new reference, or nullptr with an error set, or Py_NotImplemented (a new
// reference) to say "not read here: take the full path".
PyObject* bail() {
  Py_INCREF(Py_NotImplemented);
  return Py_NotImplemented;
}

PyObject* tensor_item(Walk& w, PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) return bail();
  PyObject* addr = PyLong_FromVoidPtr(t.storage().unsafeGetStorageImpl());
  if (!addr) return nullptr;
  PyObject* entry = PyDict_GetItemWithError(w.table, addr);  // borrowed
  Py_DECREF(addr);
  if (!entry) return PyErr_Occurred() ? nullptr : bail();
  Py_ssize_t slot = -1;
  for (size_t i = 0; i < w.seen.size(); ++i) {
    if (w.seen[i] == entry) {
      slot = static_cast<Py_ssize_t>(i);
      break;
    }
  }
  PyObject* spec;
  if (slot < 0) {
    slot = static_cast<Py_ssize_t>(w.seen.size());
    if (PyList_Append(w.entries, entry) < 0) return nullptr;
    w.seen.push_back(entry);
    PyObject* numel = PyObject_GetAttr(entry, s_numel);
    PyObject* dtype = numel ? PyObject_GetAttr(entry, s_dtype) : nullptr;
    PyObject* buf = dtype ? PyObject_GetAttr(entry, s_buf) : nullptr;
    if (!buf) {
      Py_XDECREF(numel);
      Py_XDECREF(dtype);
      return nullptr;
    }
    PyObject* written = buf != Py_None ? Py_True : Py_False;
    Py_DECREF(buf);
    Py_INCREF(written);
    spec = PyTuple_Pack(3, numel, dtype, written);
    Py_DECREF(numel);
    Py_DECREF(dtype);
    Py_DECREF(written);
    if (!spec) return nullptr;
  } else {
    spec = Py_None;
    Py_INCREF(spec);
  }
  const int64_t off = t.storage_offset();
  if (off) {
    PyObject* o = PyLong_FromLongLong(off);
    if (!o || PyList_Append(w.offsets, o) < 0) {
      Py_XDECREF(o);
      Py_DECREF(spec);
      return nullptr;
    }
    Py_DECREF(o);
  }
  if (PyList_Append(w.tensors, obj) < 0) {
    Py_DECREF(spec);
    return nullptr;
  }
  PyObject* sizes = int_tuple(t.sizes());
  PyObject* strides = sizes ? int_tuple(t.strides()) : nullptr;
  PyObject* s = strides ? PyLong_FromSsize_t(slot) : nullptr;
  if (!s) {
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    Py_DECREF(spec);
    return nullptr;
  }
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // borrowed
  PyObject* item = PyTuple_New(8);
  if (!item) {
    Py_DECREF(s);
    Py_DECREF(sizes);
    Py_DECREF(strides);
    Py_DECREF(spec);
    return nullptr;
  }
  PyObject* has_off = off ? Py_True : Py_False;
  PyObject* neg = t.is_neg() ? Py_True : Py_False;
  PyObject* conj = t.is_conj() ? Py_True : Py_False;
  Py_INCREF(has_off);
  Py_INCREF(dtype);
  Py_INCREF(neg);
  Py_INCREF(conj);
  PyTuple_SET_ITEM(item, 0, s);
  PyTuple_SET_ITEM(item, 1, spec);
  PyTuple_SET_ITEM(item, 2, sizes);
  PyTuple_SET_ITEM(item, 3, strides);
  PyTuple_SET_ITEM(item, 4, has_off);
  PyTuple_SET_ITEM(item, 5, dtype);
  PyTuple_SET_ITEM(item, 6, neg);
  PyTuple_SET_ITEM(item, 7, conj);
  return item;
}

bool exact_number(PyObject* v) {
  return PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyComplex_CheckExact(v);
}

bool is_nan(PyObject* v) {
  if (PyFloat_CheckExact(v)) {
    double d = PyFloat_AS_DOUBLE(v);
    return d != d;
  }
  if (PyComplex_CheckExact(v)) {
    Py_complex c = PyComplex_AsCComplex(v);
    return c.real != c.real || c.imag != c.imag;
  }
  return false;
}

PyObject* item(Walk& w, PyObject* v, bool runtime, long kind);

PyObject* list_item(Walk& w, PyObject* v, bool runtime, long kind) {
  PyObject* seq = PySequence_Fast(v, "");
  if (!seq) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** xs = PySequence_Fast_ITEMS(seq);
  bool walk = (kind == 2 && runtime) || kind == 1;
  for (Py_ssize_t i = 0; !walk && i < n; ++i) walk = THPVariable_Check(xs[i]);
  PyObject* out;
  if (walk) {  // item by item, as flatten encodes it
    PyObject* items = PyTuple_New(n);
    if (!items) {
      Py_DECREF(seq);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* k = item(w, xs[i], runtime, kind);
      if (!k || k == Py_NotImplemented) {
        Py_DECREF(items);
        Py_DECREF(seq);
        return k;
      }
      PyTuple_SET_ITEM(items, i, k);
    }
    out = PyTuple_Pack(2, reinterpret_cast<PyObject*>(&PyList_Type), items);
    Py_DECREF(items);
  } else {  // a static value: numbers only
    PyObject* vals = PyTuple_New(n);
    PyObject* types = vals ? PyTuple_New(n) : nullptr;
    if (!types) {
      Py_XDECREF(vals);
      Py_DECREF(seq);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* x = xs[i];
      if (!exact_number(x) || is_nan(x)) {
        Py_DECREF(vals);
        Py_DECREF(types);
        Py_DECREF(seq);
        return bail();
      }
      Py_INCREF(x);
      PyTuple_SET_ITEM(vals, i, x);
      PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(x));
      Py_INCREF(tp);
      PyTuple_SET_ITEM(types, i, tp);
    }
    out = PyTuple_Pack(3, reinterpret_cast<PyObject*>(&PyTuple_Type), vals, types);
    Py_DECREF(vals);
    Py_DECREF(types);
  }
  Py_DECREF(seq);
  return out;
}

PyObject* item(Walk& w, PyObject* v, bool runtime, long kind) {
  if (exact_number(v)) {
    PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(v));
    if (runtime) {
      if (PyList_Append(w.dyn, v) < 0) return nullptr;
      if (PyComplex_CheckExact(v)) {
        // its imaginary part, zero or not, keys its own signature (eager/argcheck.py)
        return PyTuple_Pack(2, tp, PyComplex_ImagAsDouble(v) != 0.0 ? Py_True : Py_False);
      }
      Py_INCREF(tp);
      return tp;
    }
    if (is_nan(v)) return bail();  // never equal to itself, so never found again
    return PyTuple_Pack(2, v, tp);
  }
  if (THPVariable_Check(v)) return tensor_item(w, v);
  if (v == Py_None) {
    Py_INCREF(v);
    return v;
  }
  if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) return list_item(w, v, runtime, kind);
  if (THPDtype_Check(v) || THPDevice_Check(v) || THPMemoryFormat_Check(v) || THPLayout_Check(v) ||
      PyUnicode_CheckExact(v)) {
    Py_INCREF(v);
    return v;
  }
  return bail();
}

// The quick key of (args, kwargs) under `head` (see csrc/scan.cpp), the walk's lists filled;
// None where an argument is not read here, nullptr with an error set.
// info: (runtime, kinds, by_name), as Lowering.scan_info
PyObject* walk_key(Walk& w, PyObject* head, PyObject* args, PyObject* kwargs, PyObject* info) {
  if (!PyTuple_Check(args) || !PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3) {
    PyErr_SetString(PyExc_TypeError, "scan: args and info must be tuples");
    return nullptr;
  }
  PyObject* runtime = PyTuple_GET_ITEM(info, 0);
  PyObject* kinds = PyTuple_GET_ITEM(info, 1);
  PyObject* by_name = PyTuple_GET_ITEM(info, 2);
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  const Py_ssize_t ninfo = PyTuple_GET_SIZE(runtime);
  const Py_ssize_t nkw = (kwargs != Py_None) ? PyDict_GET_SIZE(kwargs) : 0;
  PyObject* key = PyTuple_New(1 + nargs + nkw);
  if (!key) return nullptr;
  Py_INCREF(head);
  PyTuple_SET_ITEM(key, 0, head);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    bool rt = false;
    long kind = 0;
    if (i < ninfo) {
      rt = PyTuple_GET_ITEM(runtime, i) == Py_True;
      kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
    }
    PyObject* k = item(w, PyTuple_GET_ITEM(args, i), rt, kind);
    if (!k || k == Py_NotImplemented) {
      Py_DECREF(key);
      if (!k) return nullptr;
      Py_DECREF(k);
      Py_RETURN_NONE;
    }
    PyTuple_SET_ITEM(key, 1 + i, k);
  }
  Py_ssize_t pos = 0, j = 1 + nargs;
  PyObject *name, *v;
  while (nkw && PyDict_Next(kwargs, &pos, &name, &v)) {
    PyObject* meta = PyDict_GetItemWithError(by_name, name);  // (runtime, kind) | NULL
    if (!meta && PyErr_Occurred()) {
      Py_DECREF(key);
      return nullptr;
    }
    bool rt = meta && PyTuple_GET_ITEM(meta, 0) == Py_True;
    long kind = meta ? PyLong_AsLong(PyTuple_GET_ITEM(meta, 1)) : 0;
    PyObject* k = item(w, v, rt, kind);
    if (!k || k == Py_NotImplemented) {
      Py_DECREF(key);
      if (!k) return nullptr;
      Py_DECREF(k);
      Py_RETURN_NONE;
    }
    PyObject* pair = PyTuple_Pack(2, name, k);
    Py_DECREF(k);
    if (!pair) {
      Py_DECREF(key);
      return nullptr;
    }
    PyTuple_SET_ITEM(key, j++, pair);
  }
  return key;
}

void walk_init() {
  s_numel = PyUnicode_InternFromString("numel");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_buf = PyUnicode_InternFromString("buf");
}

}  // namespace
