// defer_and_fuse's record of an op whose signature was recorded before: eager/deferred.record's
// common case in one C++ pass, as hit.cpp's serve() is the strict hit's. Included once, by
// hit.cpp, after the helpers it uses (make_empty, attach, tidy_parked, not_here).
//
// deferred.record stays the general path: a fresh signature (the compile-storm guard counts
// it), a region at its size cap or churning (the record ends in a flush), a random op, a failed
// or foreign buffer, an assertion node, another device. Those hand the call back (NotImplemented)
// before anything is changed, and the executor (resume, _launch) records it in Python.
//
// record(compiled, entries, dyn, name): the same from the Python executor (see below)
// configure_record(globals, lock, node_type, pending_type, fused, replayed, internal, is_internal)
//   deferred's module dict (its _graph, the region being recorded, is replaced by each flush;
//   MAX_OPS may be set by tests), its _lock, _Node, runtime.pending.Pending, the members (a
//   dict) of the LRU sets of signatures that ran fused or replayed, and origin's code-object
//   cache and its test (origin.user_frame's walk over the stack is done here too)
#pragma once

// (included inside hit.cpp's anonymous namespace, after csrc/slots.h)
namespace {

struct Rec {
  PyObject* globals = nullptr;
  PyObject* acquire = nullptr;
  PyObject* unlock = nullptr;
  PyObject* fused = nullptr;
  PyObject* replayed = nullptr;
  PyObject* internal = nullptr;
  PyObject* is_internal = nullptr;
} rec;

// nodes and Pendings are made without their __init__ (csrc/slots.h)
SlotMaker node_maker;
SlotMaker pending_maker;

PyObject* s_graph;
PyObject* s_max_ops;
PyObject* s_nodes;
PyObject* s_inputs;
PyObject* s_input_index;
PyObject* s_scalars;
PyObject* s_fresh;
PyObject* s_churn;
PyObject* s_written;
PyObject* s_overwritten;
PyObject* s_program;
PyObject* s_node;
PyObject* s_key;
PyObject* s_zero;
PyObject* s_one;
PyObject* s_native_records;

void record_init() {
  s_graph = PyUnicode_InternFromString("_graph");
  s_max_ops = PyUnicode_InternFromString("MAX_OPS");
  s_nodes = PyUnicode_InternFromString("nodes");
  s_inputs = PyUnicode_InternFromString("inputs");
  s_input_index = PyUnicode_InternFromString("input_index");
  s_scalars = PyUnicode_InternFromString("scalars");
  s_fresh = PyUnicode_InternFromString("fresh");
  s_churn = PyUnicode_InternFromString("churn");
  s_written = PyUnicode_InternFromString("written");
  s_overwritten = PyUnicode_InternFromString("overwritten");
  s_program = PyUnicode_InternFromString("program");
  s_node = PyUnicode_InternFromString("node");
  s_key = PyUnicode_InternFromString("key");
  s_zero = PyLong_FromLong(0);
  s_one = PyLong_FromLong(1);
  s_native_records = PyUnicode_InternFromString("native_records");
}

PyObject* configure_record(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 8 || !PyDict_Check(a[0]) || !PyDict_Check(a[4]) || !PyDict_Check(a[5]) || !PyDict_Check(a[6])) {
    PyErr_SetString(PyExc_TypeError,
                    "configure_record(globals, lock, node_type, pending_type, fused, replayed, internal, is_internal)");
    return nullptr;
  }
  PyObject* acquire = PyObject_GetAttrString(a[1], "acquire");
  PyObject* unlock = acquire ? PyObject_GetAttrString(a[1], "release") : nullptr;
  if (!unlock) {
    Py_XDECREF(acquire);
    return nullptr;
  }
  SlotMaker node, pending;  // (all or nothing: a refused type leaves the configuration as it was)
  if (!slot_maker(a[2], {"program", "refs", "nscalars", "rng", "origin", "name", "compiled", "collective"}, node) ||
      !slot_maker(a[3], {"node", "key"}, pending)) {
    Py_XDECREF(reinterpret_cast<PyObject*>(node.type));
    Py_XDECREF(reinterpret_cast<PyObject*>(pending.type));
    Py_DECREF(acquire);
    Py_DECREF(unlock);
    return nullptr;
  }
  Py_XDECREF(reinterpret_cast<PyObject*>(node_maker.type));
  Py_XDECREF(reinterpret_cast<PyObject*>(pending_maker.type));
  node_maker = std::move(node);
  pending_maker = std::move(pending);
  Py_XSETREF(rec.acquire, acquire);
  Py_XSETREF(rec.unlock, unlock);
  PyObject** slots[] = {&rec.globals, nullptr, nullptr, nullptr, &rec.fused,
                        &rec.replayed, &rec.internal, &rec.is_internal};
  for (int i = 0; i < 8; ++i) {
    if (!slots[i]) continue;
    Py_INCREF(a[i]);
    Py_XSETREF(*slots[i], a[i]);
  }
  Py_RETURN_NONE;
}

// deferred._lock held for the record, as the Python code holds it (reentrant: a flush from
// within a record takes it again)
struct RecLocked {
  bool ok;
  RecLocked() {
    PyObject* r = PyObject_CallNoArgs(rec.acquire);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  ~RecLocked() {
    if (!ok) return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject* r = PyObject_CallNoArgs(rec.unlock);
    if (r) Py_DECREF(r);
    else PyErr_Clear();
    PyErr_Restore(et, ev, tb);
  }
};

// What a region holds per op lives until the region runs, long enough for Python's cyclic GC
// to move it into its oldest generation, and enough objects moved there bring on a full
// collection of the whole heap (200+ ms with torch and jax loaded: a training loop in
// defer_and_fuse had one every few hundred steps). The objects below can never be part of a
// reference cycle, so they are taken off the GC's lists (PyObject_GC_UnTrack, as CPython does
// for tuples of atomic values); reference counting frees them when the region is done:
// - a Pending holds its node index (an int) and output key (an int or ("u", slot));
// - a weakref without a callback holds no strong reference, and the pair (weakref, Pending)
//   only those two;
// - the refs and origin tuples hold ints, strings and such tuples (CPython untracks those
//   itself, but only when a collection first looks at them);
// - a node holds those, its op's name, program and executable: nothing that leads back to a
//   node (the op cache holds executables, a fused region's program holds its nodes, never the
//   reverse; test_native_record checks a run region is freed by reference counting).
// (untrack: csrc/slots.h)

// origin.user_frame: (file, line, function) of the first frame on the stack that is not torch's
// or torchtpu's, or None; a new reference, nullptr with an error set
PyObject* user_origin() {
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    PyObject* c = reinterpret_cast<PyObject*>(code);
    // origin.internal_code: id(code) -> (code, internal?)
    PyObject* id = PyLong_FromVoidPtr(c);
    PyObject* known = id ? PyDict_GetItemWithError(rec.internal, id) : nullptr;  // borrowed
    int internal = -1;
    if (known && PyTuple_Check(known) && PyTuple_GET_SIZE(known) == 2 && PyTuple_GET_ITEM(known, 0) == c) {
      internal = PyObject_IsTrue(PyTuple_GET_ITEM(known, 1));
    } else if (id && !PyErr_Occurred()) {  // first seen here: asked of origin.is_internal, remembered
      PyObject* r = PyObject_CallOneArg(rec.is_internal, c);
      PyObject* entry = r ? PyTuple_Pack(2, c, r) : nullptr;
      if (entry && PyDict_SetItem(rec.internal, id, entry) == 0) internal = PyObject_IsTrue(r);
      Py_XDECREF(entry);
      Py_XDECREF(r);
    }
    Py_XDECREF(id);
    if (internal < 0) {
      Py_DECREF(code);
      Py_DECREF(f);
      return nullptr;
    }
    if (!internal) {
      PyObject* line = PyLong_FromLong(PyFrame_GetLineNumber(f));
      PyObject* out = line ? PyTuple_Pack(3, code->co_filename, line, code->co_name) : nullptr;
      if (out) untrack(out);
      Py_XDECREF(line);
      Py_DECREF(code);
      Py_DECREF(f);
      return out;
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(code);
    Py_DECREF(f);
    f = back;
  }
  Py_RETURN_NONE;
}


// a new Pending(node, key), or nullptr
PyObject* new_pending(PyObject* node, PyObject* key) {
  PyObject* values[] = {node, key};
  return make_slotted(pending_maker, values, false);
}

// written.append((weakref.ref(entry), p)); -1 on error
int note_written(PyObject* written, PyObject* entry, PyObject* p) {
  PyObject* wr = PyWeakref_NewRef(entry, nullptr);
  if (!wr) return -1;
  PyObject* pair = PyTuple_Pack(2, wr, p);
  Py_DECREF(wr);
  if (!pair) return -1;
  untrack(wr);
  untrack(pair);
  const int rc = PyList_Append(written, pair);
  Py_DECREF(pair);
  return rc;
}

// Is this planned call's record ours? 1 yes, 0 no (deferred.record must take it: the region
// would end, the signature is fresh, a buffer is not plain), -1 on error. `g` is the region.
int recordable(PyObject* g, PyObject* compiled, PyObject* entries) {
  PyObject* nodes = PyObject_GetAttr(g, s_nodes);
  if (!nodes) return -1;
  const Py_ssize_t len = PyList_Check(nodes) ? PyList_GET_SIZE(nodes) : -1;
  Py_DECREF(nodes);
  if (len < 0) return 0;
  PyObject* max_ops = PyDict_GetItemWithError(rec.globals, s_max_ops);  // borrowed
  if (!max_ops) return PyErr_Occurred() ? -1 : 0;
  const long long cap = PyLong_AsLongLong(max_ops);
  if (cap == -1 && PyErr_Occurred()) return -1;
  if (len + 1 >= cap) return 0;  // this record ends the region ("size_cap")
  PyObject* churn = PyObject_GetAttr(g, s_churn);
  if (!churn) return -1;
  const int churning = PyObject_IsTrue(churn);
  Py_DECREF(churn);
  if (churning) return churning < 0 ? -1 : 0;  // a region being watched for a compile storm
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); ++i) {
    PyObject* b = entry_buf(PyList_GET_ITEM(entries, i));
    if (!b) return -1;
    const bool plain = b == Py_None || Py_TYPE(b) == st.array_type ||
                       Py_TYPE(b) == pending_maker.type;
    Py_DECREF(b);
    if (!plain) return 0;  // a failed one raises there, a foreign one is the Python path's
  }
  // a signature that ran fused or replayed before, or is in this region already: not fresh
  int seen = PyDict_Contains(rec.fused, compiled);
  if (seen == 0) seen = PyDict_Contains(rec.replayed, compiled);
  if (seen == 0) {
    PyObject* fresh = PyObject_GetAttr(g, s_fresh);
    if (!fresh) return -1;
    seen = PySet_Check(fresh) ? PySet_Contains(fresh, compiled) : 0;
    Py_DECREF(fresh);
  }
  return seen;
}

// the refs of deferred.record: per entry (0, node, key) of a pending buffer, (1, input index)
// of a computed one, None of an unwritten one; new inputs noted in the region
PyObject* record_refs(PyObject* g, PyObject* entries) {
  PyObject* inputs = PyObject_GetAttr(g, s_inputs);
  PyObject* index = inputs ? PyObject_GetAttr(g, s_input_index) : nullptr;
  const Py_ssize_t ne = PyList_GET_SIZE(entries);
  PyObject* refs = index ? PyTuple_New(ne) : nullptr;
  if (!refs || !PyList_Check(inputs) || !PyDict_Check(index)) {
    if (refs && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a region without inputs");
    Py_XDECREF(refs);
    Py_XDECREF(inputs);
    Py_XDECREF(index);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < ne; ++i) {
    PyObject* b = entry_buf(PyList_GET_ITEM(entries, i));
    PyObject* r = nullptr;
    if (!b) goto fail;
    if (b == Py_None) {
      r = Py_None;
      Py_INCREF(r);
    } else if (Py_TYPE(b) == pending_maker.type) {
      PyObject* node = PyObject_GetAttr(b, s_node);
      PyObject* key = node ? PyObject_GetAttr(b, s_key) : nullptr;
      r = key ? PyTuple_Pack(3, s_zero, node, key) : nullptr;
      if (r) untrack(r);
      Py_XDECREF(node);
      Py_XDECREF(key);
    } else {
      PyObject* id = PyLong_FromVoidPtr(b);
      PyObject* j = id ? PyDict_GetItemWithError(index, id) : nullptr;  // borrowed
      if (j) {
        Py_INCREF(j);
      } else if (id && !PyErr_Occurred()) {
        j = PyLong_FromSsize_t(PyList_GET_SIZE(inputs));
        if (j && (PyDict_SetItem(index, id, j) < 0 || PyList_Append(inputs, b) < 0)) Py_CLEAR(j);
      }
      r = j ? PyTuple_Pack(2, s_one, j) : nullptr;
      if (r) untrack(r);
      Py_XDECREF(j);
      Py_XDECREF(id);
    }
    Py_DECREF(b);
    if (!r) goto fail;
    PyTuple_SET_ITEM(refs, i, r);
  }
  Py_DECREF(inputs);
  Py_DECREF(index);
  untrack(refs);
  return refs;
fail:
  Py_DECREF(refs);
  Py_DECREF(inputs);
  Py_DECREF(index);
  return nullptr;
}

// deferred.record for compiled.rec (executor._plan_record): (outs, structure, updated) with outs
// as compiled.hit's, structure 0 one, 1 tuple, 2 list, 3 in place, updated the (slot, ("u", slot))
// an in-place op writes. The op's outputs (a new reference: its result before the in-place
// return, which the caller makes), or NotImplemented before anything changed.
PyObject* record_planned(PyObject* compiled, PyObject* plan, PyObject* entries, PyObject* dyn, PyObject* name) {
  PyObject* outs = PyTuple_GET_ITEM(plan, 0);
  const long structure = PyLong_AsLong(PyTuple_GET_ITEM(plan, 1));
  PyObject* updated = PyTuple_GET_ITEM(plan, 2);
  RecLocked lock;
  if (!lock.ok) return nullptr;
  PyObject* g = PyDict_GetItemWithError(rec.globals, s_graph);  // the region being recorded
  if (!g) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: deferred has no region");
    return nullptr;
  }
  Py_INCREF(g);
  PyObject* result = nullptr;
  PyObject* refs = nullptr;
  PyObject* origin = nullptr;
  PyObject* nodes = nullptr;
  PyObject* written = nullptr;
  PyObject* j = nullptr;
  const int ours = recordable(g, compiled, entries);
  if (ours <= 0) {
    Py_DECREF(g);
    return ours < 0 ? nullptr : not_here();
  }
  PyObject* now = PyIter_Next(st.clock);  // the op cache's LRU clock: this use
  if (!now || PyObject_SetAttr(compiled, s_used, now) < 0) {
    Py_XDECREF(now);
    Py_DECREF(g);
    return nullptr;
  }
  Py_DECREF(now);
  if (add_to(st.counts, s_native_records, 1) < 0) {  // metrics()["native_records"]
    Py_DECREF(g);
    return nullptr;
  }
  refs = record_refs(g, entries);
  origin = refs ? user_origin() : nullptr;
  nodes = origin ? PyObject_GetAttr(g, s_nodes) : nullptr;
  written = nodes ? PyObject_GetAttr(g, s_written) : nullptr;
  if (!written || !PyList_Check(nodes) || !PyList_Check(written)) {
    if (written) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a region's nodes are not a list");
    goto done;
  }
  j = PyLong_FromSsize_t(PyList_GET_SIZE(nodes));
  {
    PyObject* program = j ? PyObject_GetAttr(compiled, s_program) : nullptr;
    PyObject* ns = program ? PyLong_FromSsize_t(PyList_GET_SIZE(dyn)) : nullptr;
    PyObject* node = nullptr;
    if (ns) {
      PyObject* args[] = {program, refs, ns, Py_None, origin, name, compiled, Py_False};
      node = make_slotted(node_maker, args, false);
    }
    Py_XDECREF(program);
    Py_XDECREF(ns);
    if (!node) goto done;
    const int rc = PyList_Append(nodes, node);
    Py_DECREF(node);
    if (rc < 0) goto done;
  }
  if (PyList_GET_SIZE(dyn)) {
    PyObject* scalars = PyObject_GetAttr(g, s_scalars);
    const Py_ssize_t at = scalars && PyList_Check(scalars) ? PyList_GET_SIZE(scalars) : -1;
    const int rc = at < 0 ? -1 : PyList_SetSlice(scalars, at, at, dyn);
    if (at < 0 && scalars) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a region's scalars are not a list");
    Py_XDECREF(scalars);
    if (rc < 0) goto done;
  }
  if (structure == 3) {  // in place: the written storages' buffers are this node's writes
    PyObject* overwritten = PyObject_GetAttr(g, s_overwritten);
    if (!overwritten) goto done;
    int rc = 0;
    for (Py_ssize_t u = 0; u < PyTuple_GET_SIZE(updated) && rc == 0; ++u) {
      PyObject* slot_key = PyTuple_GET_ITEM(updated, u);
      const Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(slot_key, 0));
      if (s < 0 || s >= PyList_GET_SIZE(entries)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a write past the call's storages");
        rc = -1;
        break;
      }
      PyObject* r = PyTuple_GET_ITEM(refs, s);
      if (r != Py_None && PyTuple_GET_ITEM(r, 0) == s_one) rc = PySet_Add(overwritten, PyTuple_GET_ITEM(r, 1));
      PyObject* p = rc == 0 ? new_pending(j, PyTuple_GET_ITEM(slot_key, 1)) : nullptr;
      PyObject* e = PyList_GET_ITEM(entries, s);
      if (!p || PyObject_SetAttr(e, s_buf, p) < 0 || note_written(written, e, p) < 0) rc = -1;
      Py_XDECREF(p);
    }
    Py_DECREF(overwritten);
    if (rc == 0) {
      result = Py_None;
      Py_INCREF(result);
    }
    goto done;
  }
  if (tidy_parked() < 0) goto done;
  {
    const Py_ssize_t no = PyTuple_GET_SIZE(outs);
    PyObject* res = PyTuple_New(no);
    if (!res) goto done;
    long k = 0;
    for (Py_ssize_t i = 0; i < no; ++i) {
      PyObject* spec = PyTuple_GET_ITEM(outs, i);
      if (spec == Py_None) {  // an output not asked for
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(res, i, Py_None);
        continue;
      }
      PyObject* kk = PyLong_FromLong(k++);
      PyObject* p = kk ? new_pending(j, kk) : nullptr;
      Py_XDECREF(kk);
      PyObject* entry = nullptr;
      PyObject* obj = p ? planned_output(spec, p, &entry) : nullptr;
      if (obj && note_written(written, entry, p) < 0) Py_CLEAR(obj);
      Py_XDECREF(entry);
      Py_XDECREF(p);
      if (!obj) {
        Py_DECREF(res);
        goto done;
      }
      PyTuple_SET_ITEM(res, i, obj);
    }
    result = structured(res, structure);
  }
done:
  Py_XDECREF(j);
  Py_XDECREF(written);
  Py_XDECREF(nodes);
  Py_XDECREF(origin);
  Py_XDECREF(refs);
  Py_DECREF(g);
  return result;
}

// record(compiled, entries, dyn, name) -> outputs | NotImplemented
//   compiled.rec recorded from the Python executor (a call fast() did not take: a carried
//   dtype seen in the process, say); an in-place op's result is None, the caller returns the
//   written argument
PyObject* record(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4 || !PyList_CheckExact(a[1]) || !PyList_Check(a[2])) {
    PyErr_SetString(PyExc_TypeError, "record(compiled, entries, dyn, name)");
    return nullptr;
  }
  if (!rec.globals || !configured()) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: configure_record() was not called");
    return nullptr;
  }
  PyObject* plan = PyObject_GetAttr(a[0], s_rec);
  if (!plan) return nullptr;
  PyObject* out;
  if (PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) == 5) out = record_planned(a[0], plan, a[1], a[2], a[3]);
  else out = not_here();
  Py_DECREF(plan);
  return out;
}

}  // namespace
