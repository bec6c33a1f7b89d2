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

#include <cstring>
#include <string>
#include <vector>

namespace {


PyObject* s_numel = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_buf = nullptr;

// o.<name>: read at its slot's offset `off` where `o` is exactly `type` (a __slots__ class
// whose layout the caller checked: csrc/slots.h), else by name (a slot's member descriptor
// call, ~1.5 % of a strict 16x16 add for the walk's three); a new reference, or nullptr with
// an error set
PyObject* slot_read(PyObject* o, PyTypeObject* type, Py_ssize_t off, PyObject* name) {
  if (Py_TYPE(o) == type) {
    PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + off);
    if (v) {
      Py_INCREF(v);
      return v;
    }
  }
  return PyObject_GetAttr(o, name);  // (an unset slot raises its AttributeError there)
}

// where a storage entry's slots lie, when the extension knows storage.Entry (csrc/hit.cpp
// sets it when configured; csrc/scan.cpp reads by name)
struct EntrySlots {
  PyTypeObject* type = nullptr;
  Py_ssize_t buf = 0, numel = 0, dtype = 0;
} entry_slots;

PyObject* entry_buf(PyObject* e) { return slot_read(e, entry_slots.type, entry_slots.buf, s_buf); }

struct Walk {
  PyObject* table;
  PyObject* entries;
  PyObject* offsets;
  PyObject* dyn;
  PyObject* tensors;
  std::vector<PyObject*> seen;  // entries, by slot (borrowed: `entries` holds them)
  // The key's items as bytes, where `sig` is given (csrc/hit.cpp's memo of keys it looked up):
  // a tag per item, lengths before what varies, values where the key compares values, object
  // addresses where it compares identities (dtypes, layouts, memory formats: never freed; an
  // entry's numpy dtype: the memo holds the key holding it). Equal bytes mean equal keys (the
  // converse need not hold: 0.0 and -0.0, an equal string object). `flat_ok` false: something
  // here has no byte form (an int past 64 bits): the memo is not used for this call.
  std::string* sig = nullptr;
  bool flat_ok = true;
  // false: the Python key is not made (each item answers None): the walk only fills the lists
  // and `sig`
  bool build = true;
};

void put(Walk& w, char tag) {
  if (w.sig) w.sig->push_back(tag);
}

void put(Walk& w, int64_t v) {
  if (w.sig) w.sig->append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put(Walk& w, const void* p) {
  if (w.sig) w.sig->append(reinterpret_cast<const char*>(&p), sizeof p);
}

void put(Walk& w, c10::IntArrayRef xs) {
  put(w, static_cast<int64_t>(xs.size()));
  if (w.sig) w.sig->append(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(int64_t));
}

// a Python int's value; flat_ok cleared where it has no 64-bit form
void put_int(Walk& w, PyObject* v) {
  if (!w.sig) return;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    w.flat_ok = false;
    return;
  }
  put(w, static_cast<int64_t>(x));
}

// a number's type and, for a static one, its value (bits: finer than ==, never coarser)
void put_number(Walk& w, PyObject* v, bool value) {
  if (!w.sig) return;
  if (PyBool_Check(v)) {
    put(w, 'b');
    if (value) put(w, static_cast<char>(v == Py_True));
  } else if (PyLong_CheckExact(v)) {
    put(w, 'i');
    if (value) put_int(w, v);
  } else if (PyFloat_CheckExact(v)) {
    put(w, 'f');
    if (value) {
      const double d = PyFloat_AS_DOUBLE(v);
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      put(w, bits);
    }
  } else {
    put(w, 'c');
    const Py_complex c = PyComplex_AsCComplex(v);
    if (value) {
      int64_t bits[2];
      std::memcpy(bits, &c, sizeof bits);
      put(w, bits[0]);
      put(w, bits[1]);
    } else {
      put(w, static_cast<char>(c.imag != 0.0));
    }
  }
}

PyObject* none() {
  Py_INCREF(Py_None);
  return Py_None;
}

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
  put(w, 't');
  PyObject* spec = nullptr;
  if (slot < 0) {
    slot = static_cast<Py_ssize_t>(w.seen.size());
    if (PyList_Append(w.entries, entry) < 0) return nullptr;
    w.seen.push_back(entry);
    PyObject* numel = slot_read(entry, entry_slots.type, entry_slots.numel, s_numel);
    PyObject* dtype = numel ? slot_read(entry, entry_slots.type, entry_slots.dtype, s_dtype) : nullptr;
    PyObject* buf = dtype ? entry_buf(entry) : nullptr;
    if (!buf) {
      Py_XDECREF(numel);
      Py_XDECREF(dtype);
      return nullptr;
    }
    PyObject* written = buf != Py_None ? Py_True : Py_False;
    Py_DECREF(buf);
    put(w, 'n');  // a storage first seen here: its element count, dtype, whether written
    if (PyLong_CheckExact(numel)) put_int(w, numel);
    else w.flat_ok = false;
    put(w, static_cast<const void*>(dtype));
    put(w, static_cast<char>(written == Py_True));
    if (w.build) spec = PyTuple_Pack(3, numel, dtype, written);
    Py_DECREF(numel);
    Py_DECREF(dtype);
    if (w.build && !spec) return nullptr;
  } else if (w.build) {
    spec = none();
  }
  put(w, static_cast<int64_t>(slot));
  const int64_t off = t.storage_offset();
  if (off) {
    PyObject* o = PyLong_FromLongLong(off);
    if (!o || PyList_Append(w.offsets, o) < 0) {
      Py_XDECREF(o);
      Py_XDECREF(spec);
      return nullptr;
    }
    Py_DECREF(o);
  }
  if (PyList_Append(w.tensors, obj) < 0) {
    Py_XDECREF(spec);
    return nullptr;
  }
  put(w, t.sizes());
  put(w, t.strides());
  put(w, static_cast<char>((off ? 1 : 0) | (t.is_neg() ? 2 : 0) | (t.is_conj() ? 4 : 0)));
  put(w, static_cast<char>(t.scalar_type()));
  if (!w.build) return none();
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
  put(w, walk ? 'L' : 'S');
  put(w, static_cast<int64_t>(n));
  PyObject* out = nullptr;
  if (walk) {  // item by item, as flatten encodes it
    PyObject* items = w.build ? PyTuple_New(n) : nullptr;
    if (w.build && !items) {
      Py_DECREF(seq);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* k = item(w, xs[i], runtime, kind);
      if (!k || k == Py_NotImplemented) {
        Py_XDECREF(items);
        Py_DECREF(seq);
        return k;
      }
      if (items) PyTuple_SET_ITEM(items, i, k);
      else Py_DECREF(k);
    }
    if (items) {
      out = PyTuple_Pack(2, reinterpret_cast<PyObject*>(&PyList_Type), items);
      Py_DECREF(items);
    } else {
      out = none();
    }
  } else {  // a static value: numbers only
    PyObject* vals = w.build ? PyTuple_New(n) : nullptr;
    PyObject* types = vals ? PyTuple_New(n) : nullptr;
    if (w.build && !types) {
      Py_XDECREF(vals);
      Py_DECREF(seq);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* x = xs[i];
      if (!exact_number(x) || is_nan(x)) {
        Py_XDECREF(vals);
        Py_XDECREF(types);
        Py_DECREF(seq);
        return bail();
      }
      put_number(w, x, true);
      if (!vals) continue;
      Py_INCREF(x);
      PyTuple_SET_ITEM(vals, i, x);
      PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(x));
      Py_INCREF(tp);
      PyTuple_SET_ITEM(types, i, tp);
    }
    if (vals) {
      out = PyTuple_Pack(3, reinterpret_cast<PyObject*>(&PyTuple_Type), vals, types);
      Py_DECREF(vals);
      Py_DECREF(types);
    } else {
      out = none();
    }
  }
  Py_DECREF(seq);
  return out;
}

PyObject* item(Walk& w, PyObject* v, bool runtime, long kind) {
  if (exact_number(v)) {
    PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(v));
    if (runtime) {
      if (PyList_Append(w.dyn, v) < 0) return nullptr;
      put(w, 'r');
      put_number(w, v, false);
      if (!w.build) return none();
      if (PyComplex_CheckExact(v)) {
        // its imaginary part, zero or not, keys its own signature (eager/argcheck.py)
        return PyTuple_Pack(2, tp, PyComplex_ImagAsDouble(v) != 0.0 ? Py_True : Py_False);
      }
      Py_INCREF(tp);
      return tp;
    }
    if (is_nan(v)) return bail();  // never equal to itself, so never found again
    put(w, 's');
    put_number(w, v, true);
    return w.build ? PyTuple_Pack(2, v, tp) : none();
  }
  if (THPVariable_Check(v)) return tensor_item(w, v);
  if (v == Py_None) {
    put(w, '0');
    return none();
  }
  if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) return list_item(w, v, runtime, kind);
  if (THPDtype_Check(v) || THPMemoryFormat_Check(v) || THPLayout_Check(v)) {
    put(w, 'o');  // torch's own objects, one per value for the process's life
    put(w, static_cast<const void*>(v));
  } else if (THPDevice_Check(v)) {
    const c10::Device& d = reinterpret_cast<THPDevice*>(v)->device;
    put(w, 'd');
    put(w, static_cast<char>(d.type()));
    put(w, static_cast<char>(d.index()));
  } else if (PyUnicode_CheckExact(v)) {
    Py_ssize_t len = 0;
    const char* s = w.sig ? PyUnicode_AsUTF8AndSize(v, &len) : nullptr;
    if (w.sig && !s) {  // (no UTF-8 form: a lone surrogate) the key compares it; the bytes cannot
      PyErr_Clear();
      w.flat_ok = false;
    } else if (w.sig) {
      put(w, 'u');
      put(w, static_cast<int64_t>(len));
      w.sig->append(s, static_cast<size_t>(len));
    }
  } else {
    return bail();
  }
  if (!w.build) return none();
  Py_INCREF(v);
  return v;
}

// The quick key of (args, kwargs) under `head` (see csrc/scan.cpp), the walk's lists filled;
// None where an argument is not read here, nullptr with an error set. Without w.build: True
// where every argument was read (the lists and w.sig are what the caller wanted).
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
  PyObject* key = w.build ? PyTuple_New(1 + nargs + nkw) : nullptr;
  if (w.build && !key) return nullptr;
  if (key) {
    Py_INCREF(head);
    PyTuple_SET_ITEM(key, 0, head);
  }
  put(w, static_cast<int64_t>(nargs));
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    bool rt = false;
    long kind = 0;
    if (i < ninfo) {
      rt = PyTuple_GET_ITEM(runtime, i) == Py_True;
      kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
    }
    PyObject* k = item(w, PyTuple_GET_ITEM(args, i), rt, kind);
    if (!k || k == Py_NotImplemented) {
      Py_XDECREF(key);
      if (!k) return nullptr;
      Py_DECREF(k);
      Py_RETURN_NONE;
    }
    if (key) PyTuple_SET_ITEM(key, 1 + i, k);
    else Py_DECREF(k);
  }
  Py_ssize_t pos = 0, j = 1 + nargs;
  PyObject *name, *v;
  put(w, static_cast<int64_t>(nkw));
  while (nkw && PyDict_Next(kwargs, &pos, &name, &v)) {
    PyObject* meta = PyDict_GetItemWithError(by_name, name);  // (runtime, kind) | NULL
    if (!meta && PyErr_Occurred()) {
      Py_XDECREF(key);
      return nullptr;
    }
    bool rt = meta && PyTuple_GET_ITEM(meta, 0) == Py_True;
    long kind = meta ? PyLong_AsLong(PyTuple_GET_ITEM(meta, 1)) : 0;
    if (w.sig) {  // (keywords are strings: PyTorch's argument parser took them)
      Py_ssize_t len = 0;
      const char* s = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &len) : nullptr;
      if (!s) {
        PyErr_Clear();
        w.flat_ok = false;
      } else {
        put(w, static_cast<int64_t>(len));
        w.sig->append(s, static_cast<size_t>(len));
      }
    }
    PyObject* k = item(w, v, rt, kind);
    if (!k || k == Py_NotImplemented) {
      Py_XDECREF(key);
      if (!k) return nullptr;
      Py_DECREF(k);
      Py_RETURN_NONE;
    }
    if (!key) {
      Py_DECREF(k);
      continue;
    }
    PyObject* pair = PyTuple_Pack(2, name, k);
    Py_DECREF(k);
    if (!pair) {
      Py_DECREF(key);
      return nullptr;
    }
    PyTuple_SET_ITEM(key, j++, pair);
  }
  if (!key) Py_RETURN_TRUE;
  return key;
}

void walk_init() {
  s_numel = PyUnicode_InternFromString("numel");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_buf = PyUnicode_InternFromString("buf");
}

}  // namespace
