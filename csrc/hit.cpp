// The host's hot paths without Python frames: a strict op's cache hit, a compiled graph's call,
// a new tensor's storage entry, a view.
//
// A tpu tensor is a torch.Tensor over a zero-byte storage whose data is a flat JAX array held
// by a storage entry (runtime/storage.py: the table maps the StorageImpl's address to the
// entry; when the storage dies, its DataPtr's deleter drops the entry of a tensor made here,
// a weakref on the storage's Python object the entry of one made in Python).
// Making such a tensor in Python (tensors.empty_with_entry, storage.attach) took ~4 us, as
// much as the jitted call it wraps; and a strict op's cache hit went through some forty
// Python calls around that one call. Here both are one C++ pass each, doing exactly what the
// Python code states (it stays: it serves every case this does not: other devices, strides,
// carried dtypes, in-place ops, check flags, the profiler, errors):
//
// configure(table, stats, counts, clock, parked, tidy, entry_type, array_type, lock, release,
//           max_parked, tidy_step)
//   the Python state these functions act on: storage.table, device 0's allocation stats,
//   metrics' counters, executables.clock, inflight.parked_buffers and inflight.tidy,
//   storage.Entry, the type of a JAX array (what a buffer must be for a hit), storage._lock (a GilLock),
//   storage._release (the release's general case) and inflight's two bounds
// new_tensor(shape, dtype, npdtype, buf) -> (tensor, entry)
//   a contiguous tpu tensor on device 0 over a new storage entry holding `buf`
// alias(base, shape, stride, offset, dtype) -> tensor
//   a view of `base`'s storage on device 0 with that geometry (tensors.alias)
// hit(compiled, entries, packed) -> result | NotImplemented
//   runs compiled.hit (the plan eager/executor.py made after the op's first run) on the
//   entries' buffers and the packed runtime scalars, through the program's executable where
//   the plan has it (runtime/direct.py), else its jitted function; NotImplemented where the Python path
//   must serve the call (a buffer not computed yet, or the call raised: that path runs it
//   again and reports the error as it does)
// configure_fast(...), fast(state, args, kwargs), graph_fast(quick, args)
//   the whole call of an eager op (gate, quick key, hit or defer_and_fuse record) and of a
//   compiled graph: see below
// configure_record(...)
//   what defer_and_fuse's record acts on (csrc/record.h)
// Kernel(state, check, after, full, first_seen)
//   an op's registered kernel calling fast() without a Python frame (csrc/kernel.h)
// GilLock()
//   storage._lock: a reentrant lock taken from C++ without a Python call (csrc/gil_lock.h)
// register_kernel(name, kernel)
//   that Kernel registered with the dispatcher as a C++ boxed kernel (csrc/boxed.h)
// register_view(name, kind, python_kernel)
//   a common view op as a C++ kernel, stride arithmetic over its base's storage (csrc/views.h)
#include "walk.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>
#include <c10/core/DefaultDtype.h>

#include <structmember.h>

#include <unordered_map>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "held.h"
#include "slots.h"

#include "gil_lock.h"

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

struct State {
  PyObject* table = nullptr;
  PyObject* stats = nullptr;
  PyObject* counts = nullptr;
  PyObject* clock = nullptr;
  PyObject* parked = nullptr;
  PyObject* tidy = nullptr;
  PyObject* entry_type = nullptr;
  PyTypeObject* array_type = nullptr;
  PyObject* release_py = nullptr;  // storage._release: what released() defers to off its common case
  GilLockObject* gil_lock = nullptr;  // storage._lock (a new reference)
} st;

PyObject* s_hit;
PyObject* s_consume;
PyObject* s_direct;
PyObject* s_used;
PyObject* s_index;
PyObject* s_addr;
PyObject* s_nbytes;
PyObject* s_append;
PyObject* s_is_ready;
PyObject* s_is_deleted;
PyObject* s_popleft;
PyObject* s_appendleft;
Py_ssize_t max_parked = 4096;  // inflight.MAX_PARKED (configure)
int tidy_step = 8;             // inflight.TIDY_STEP (configure)
PyObject* s_allocated;
PyObject* s_peak;
PyObject* s_cache_hits;
PyObject* s_executions;
PyObject* s_native_hits;
PyObject* s_native;
PyObject* empty_tuple;
PyObject* s_zero_index;  // 0: an entry's device index on device 0
// storage.Entry is made without its __init__ (csrc/slots.h): its slots, in order
SlotMaker entry_maker;

// dict[key] += n (a missing key counts as 0); -1 with an error set on failure
int add_to(PyObject* dict, PyObject* key, long long n, long long* now = nullptr) {
  PyObject* old = PyDict_GetItemWithError(dict, key);  // borrowed
  if (!old && PyErr_Occurred()) return -1;
  long long v = old ? PyLong_AsLongLong(old) : 0;
  if (v == -1 && PyErr_Occurred()) return -1;
  v += n;
  PyObject* nv = PyLong_FromLongLong(v);
  if (!nv) return -1;
  int rc = PyDict_SetItem(dict, key, nv);
  Py_DECREF(nv);
  if (now) *now = v;
  return rc;
}

// storage._lock (a GilLock, csrc/gil_lock.h: storage.py makes one wherever this extension is
// built), held around the table and stats updates as the Python code holds it, taken without
// a Python call
struct Locked {
  Locked() { gil_lock_take(st.gil_lock); }
  ~Locked() {
    if (!gil_lock_give(st.gil_lock)) PyErr_Clear();  // (taken above: it cannot fail)
  }
};

// A tpu tensor on device 0 over an empty storage (device_guard.create_empty's make), dense:
// contiguous, or laid out by `strides` (a permutation of them: channels_last)
at::Tensor make_empty(const std::vector<int64_t>& sizes, c10::ScalarType dtype,
                      const std::vector<int64_t>* given = nullptr) {
  const size_t n = sizes.size();
  std::vector<int64_t> strides(n);
  if (given) {
    strides = *given;
  } else {
    int64_t step = 1;
    for (size_t i = n; i > 0; --i) {
      strides[i - 1] = step;
      step *= sizes[i - 1];
    }
  }
  c10::Storage storage(c10::Storage::use_byte_size_t{}, 0, c10::GetAllocator(c10::kMeta), true);
  storage.set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(kType, 0)));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, 0);
  return t;
}

// a tuple of ints as a vector; false with an error set
bool int_vector(PyObject* tup, std::vector<int64_t>& out) {
  PyObject* seq = PySequence_Fast(tup, "expected a sequence of ints");
  if (!seq) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
  Py_DECREF(seq);
  return !PyErr_Occurred();
}

PyObject* released_entry(PyObject* key, PyObject* entry);

// Release(key, entry) (csrc/held.h): what a storage made here releases when it dies, held by
// its DataPtr as the deleter's context (release_data below)
PyTypeObject ReleaseType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// The StorageImpl of a tensor made here is being destroyed (its DataPtr's deleter, `ctx` a
// Release(key, entry)): released_entry, with the GIL taken for it, on whatever thread drops
// the storage. At interpreter exit nothing runs (the process frees it all).
void release_data(void* ctx) {
  if (!Py_IsInitialized() || Py_IsFinalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);  // an error being raised where the storage dies survives this
  PyObject* cb = static_cast<PyObject*>(ctx);
  PyObject* r = released_entry(held_item(cb, 0), held_item(cb, 1));
  if (r) Py_DECREF(r);
  else PyErr_WriteUnraisable(cb);
  Py_DECREF(cb);
  PyErr_Restore(et, ev, tb);
  PyGILState_Release(gil);
}

// storage.attach for a new tensor on device 0 (made by make_empty: its storage is new and
// nothing else sees it yet): its entry (numel, npdtype, buf) in the table, its bytes counted,
// its release tied to the StorageImpl's destruction. Python's attach watches the storage's
// Python object with a weakref; here the storage's (null) DataPtr takes a deleter instead,
// so no Python storage object, weakref or callback call is made per tensor (~4 % of a strict
// 16x16 add under perf). A new reference to the entry, or nullptr with an error set.
PyObject* attach(const at::Tensor& t, int64_t numel, PyObject* npdtype, PyObject* buf) {
  PyObject* key = PyLong_FromVoidPtr(t.storage().unsafeGetStorageImpl());
  // storage.Entry(numel, npdtype, buf), its __init__'s stores made here (csrc/slots.h)
  const long long bytes = numel * static_cast<long long>(t.dtype().itemsize());
  PyObject* n = key ? PyLong_FromLongLong(numel) : nullptr;
  PyObject* nbytes = n ? PyLong_FromLongLong(bytes) : nullptr;
  PyObject* entry = nullptr;
  if (nbytes) {
    PyObject* values[] = {buf, n, npdtype, nbytes, Py_None, Py_None, Py_False, s_zero_index};
    entry = make_slotted(entry_maker, values, true);
  }
  Py_XDECREF(nbytes);
  Py_XDECREF(n);
  PyObject* cb = entry ? new_held(ReleaseType, {key, entry}) : nullptr;
  int rc = cb ? 0 : -1;
  Locked lock;
  if (rc == 0) rc = PyDict_SetItem(st.table, key, entry);
  Py_XDECREF(key);
  if (rc == 0) {
    // in the table: its release is tied to the storage now (the storage's DataPtr was a null
    // one without a deleter, so nothing is freed by replacing it); the DataPtr owns `cb`
    t.storage().set_data_ptr_noswap(c10::DataPtr(nullptr, cb, &release_data, t.storage().device()));
    cb = nullptr;
  }
  Py_XDECREF(cb);
  if (rc == 0) {
    long long now = 0;
    rc = add_to(st.stats, s_allocated, bytes, &now);
    if (rc == 0) {
      PyObject* peak = PyDict_GetItemWithError(st.stats, s_peak);
      long long p = peak ? PyLong_AsLongLong(peak) : 0;
      if (p == -1 && PyErr_Occurred()) rc = -1;
      else if (now > p) {
        PyObject* v = PyLong_FromLongLong(now);
        rc = v ? PyDict_SetItem(st.stats, s_peak, v) : -1;
        Py_XDECREF(v);
      }
    }
  }
  if (rc != 0) {
    Py_XDECREF(entry);
    return nullptr;
  }
  return entry;
}

// let go of finished parked buffers, as storage.attach does before each new storage
// inflight.ready for a JAX array: a deleted (donated) one counts as ready; 1, 0, or -1 on error
int array_ready(PyObject* b) {
  PyObject* d = PyObject_CallMethodNoArgs(b, s_is_deleted);
  if (!d) return -1;
  const int deleted = PyObject_IsTrue(d);
  Py_DECREF(d);
  if (deleted) return deleted;
  PyObject* r = PyObject_CallMethodNoArgs(b, s_is_ready);
  if (!r) {  // (inflight.ready: an array that cannot say is ready)
    PyErr_Clear();
    return 1;
  }
  const int ready = PyObject_IsTrue(r);
  Py_DECREF(r);
  return ready;
}

// inflight.tidy's common case: the oldest parked buffers (a few per call) let go while they are
// JAX arrays that finished; anything else (another buffer type, a queue past its bound) is the
// Python function's
int tidy_parked() {
  Py_ssize_t n = PyObject_Length(st.parked);
  if (n <= 0) return n < 0 ? -1 : 0;
  if (n > max_parked) {
    PyObject* r = PyObject_CallNoArgs(st.tidy);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
  }
  for (int i = 0; i < tidy_step && n > 0; ++i, --n) {
    PyObject* b = PyObject_CallMethodNoArgs(st.parked, s_popleft);
    if (!b) {  // emptied meanwhile by another thread (a JAX call below may let go of the GIL)
      if (!PyErr_ExceptionMatches(PyExc_IndexError)) return -1;
      PyErr_Clear();
      return 0;
    }
    int ready = Py_TYPE(b) == st.array_type ? array_ready(b) : -2;
    if (ready == 1) {
      Py_DECREF(b);
      continue;
    }
    // not finished, or not ours to judge: back at the front, for later or for inflight.tidy
    PyObject* r = PyObject_CallMethodOneArg(st.parked, s_appendleft, b);
    Py_DECREF(b);
    if (!r) return -1;
    Py_DECREF(r);
    if (ready == -1) return -1;
    if (ready == -2) {
      r = PyObject_CallNoArgs(st.tidy);
      if (!r) return -1;
      Py_DECREF(r);
    }
    break;
  }
  return 0;
}

// storage._release for an entry made here (attach) whose storage died, of device 0 without
// a device address (other entries: the Python function): drop it from the table, uncount its
// bytes, park its buffer for synchronize(). Its `watch` is None (no weakref: its DataPtr's
// deleter calls this, release_data). No JAX calls here (see inflight.py).
PyObject* released_entry(PyObject* key, PyObject* entry) {
  if (Py_IsFinalizing() || !st.table) Py_RETURN_NONE;  // interpreter exit: the process frees it all
  // (slots: buf 0, numel 1, dtype 2, nbytes 3, watch 4, addr 5, untyped 6, index 7)
  PyObject* index = slot_read(entry, entry_maker.type, entry_maker.offsets[7], s_index);
  PyObject* addr = index ? slot_read(entry, entry_maker.type, entry_maker.offsets[5], s_addr) : nullptr;
  if (!addr) {
    Py_XDECREF(index);
    return nullptr;
  }
  const bool common = PyLong_CheckExact(index) && PyLong_AsLong(index) == 0 && addr == Py_None;
  Py_DECREF(index);
  Py_DECREF(addr);
  if (!common) return PyObject_CallFunctionObjArgs(st.release_py, key, entry, nullptr);
  PyObject* nb = slot_read(entry, entry_maker.type, entry_maker.offsets[3], s_nbytes);
  if (!nb) return nullptr;
  const long long nbytes = PyLong_AsLongLong(nb);
  Py_DECREF(nb);
  if (nbytes == -1 && PyErr_Occurred()) return nullptr;
  {
    Locked lock;
    PyObject* had = PyDict_GetItemWithError(st.table, key);  // borrowed
    if (had == entry && PyDict_DelItem(st.table, key) < 0) return nullptr;
    if (!had && PyErr_Occurred()) return nullptr;
    if (add_to(st.stats, s_allocated, -nbytes) < 0) return nullptr;
  }
  PyObject* buf = entry_buf(entry);
  if (!buf) return nullptr;
  // inflight.retire: a device buffer (anything with is_ready) is parked
  int park = Py_TYPE(buf) == st.array_type ? 1 : PyObject_HasAttr(buf, s_is_ready);
  PyObject* r = park ? PyObject_CallMethodOneArg(st.parked, s_append, buf) : Py_None;
  Py_DECREF(buf);
  if (!r) return nullptr;
  if (park) Py_DECREF(r);
  Py_RETURN_NONE;
}

bool configured() {
  if (st.table) return true;
  PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: configure() was not called");
  return false;
}

PyObject* configure(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 12 || !PyType_Check(a[7]) || Py_TYPE(a[8]) != &GilLockType) {
    PyErr_SetString(PyExc_TypeError, "configure: 12 arguments, the eighth a type, the ninth a GilLock");
    return nullptr;
  }
  max_parked = PyLong_AsSsize_t(a[10]);
  tidy_step = static_cast<int>(PyLong_AsLong(a[11]));
  if (PyErr_Occurred()) return nullptr;
  if (!slot_maker(a[6], {"buf", "numel", "dtype", "nbytes", "watch", "addr", "untyped", "index", "__weakref__"},
                  entry_maker))
    return nullptr;
  entry_slots = EntrySlots{entry_maker.type, entry_maker.offsets[0], entry_maker.offsets[1], entry_maker.offsets[2]};
  PyObject** slots[] = {&st.table, &st.stats, &st.counts, &st.clock, &st.parked, &st.tidy, &st.entry_type};
  for (int i = 0; i < 7; ++i) {
    Py_INCREF(a[i]);
    Py_XSETREF(*slots[i], a[i]);
  }
  Py_INCREF(a[7]);
  st.array_type = reinterpret_cast<PyTypeObject*>(a[7]);
  Py_INCREF(a[8]);
  Py_XDECREF(reinterpret_cast<PyObject*>(st.gil_lock));
  st.gil_lock = reinterpret_cast<GilLockObject*>(a[8]);
  Py_INCREF(a[9]);
  Py_XSETREF(st.release_py, a[9]);
  Py_RETURN_NONE;
}

PyObject* new_tensor(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4 || !THPDtype_Check(a[1])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(shape, dtype, npdtype, buf)");
    return nullptr;
  }
  if (!configured()) return nullptr;
  PyObject* seq = PySequence_Fast(a[0], "new_tensor: expected a sequence of sizes");
  if (!seq) return nullptr;
  const Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
  std::vector<int64_t> sizes(nd);
  int64_t numel = 1;
  for (Py_ssize_t i = 0; i < nd; ++i) {
    sizes[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    numel *= sizes[i];
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return nullptr;
  if (tidy_parked() < 0) return nullptr;
  HANDLE_TH_ERRORS
  at::Tensor t = make_empty(sizes, reinterpret_cast<THPDtype*>(a[1])->scalar_type);
  PyObject* entry = attach(t, numel, a[2], a[3]);
  if (!entry) return nullptr;
  PyObject* obj = THPVariable_Wrap(std::move(t));
  if (!obj) {
    Py_DECREF(entry);
    return nullptr;
  }
  PyObject* out = PyTuple_Pack(2, obj, entry);
  Py_DECREF(obj);
  Py_DECREF(entry);
  return out;
  END_HANDLE_TH_ERRORS
}

// alias(base, shape, stride, offset, dtype) -> tensor: tensors.alias on device 0 (a view of
// `base`'s storage with new geometry; dtype None: base's), its geometry set by the Meta kernel
// of set_ as the Python code redispatches it
PyObject* alias(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 5 || !THPVariable_Check(a[0]) || (a[4] != Py_None && !THPDtype_Check(a[4]))) {
    PyErr_SetString(PyExc_TypeError, "alias(base, shape, stride, offset, dtype)");
    return nullptr;
  }
  std::vector<int64_t> sizes, strides;
  if (!int_vector(a[1], sizes) || !int_vector(a[2], strides)) return nullptr;
  const int64_t offset = PyLong_AsLongLong(a[3]);
  if (offset == -1 && PyErr_Occurred()) return nullptr;
  HANDLE_TH_ERRORS
  const at::Tensor& base = THPVariable_Unpack(a[0]);
  const c10::ScalarType dtype = a[4] == Py_None ? base.scalar_type() : reinterpret_cast<THPDtype*>(a[4])->scalar_type;
  at::Tensor out = make_empty({0}, dtype);
  at::_ops::set__source_Storage_storage_offset::redispatch(
      c10::DispatchKeySet(c10::DispatchKey::Meta), out, base.storage(), offset, c10::fromIntArrayRefSlow(sizes),
      c10::fromIntArrayRefSlow(strides));
  // lazy conjugate/negative bits live on the tensor, not the storage: a view keeps them (a
  // negative bit also on real views: x.conj().imag is the negated imaginary part)
  if (base.is_neg() && (out.scalar_type() == base.scalar_type() || out.is_complex() == base.is_complex()))
    out._set_neg(true);
  if (base.is_conj() && out.is_complex()) out._set_conj(true);
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

PyObject* not_here() {
  Py_INCREF(Py_NotImplemented);
  return Py_NotImplemented;
}

// compiled.hit: (fn, outs, structure, codes, returned, name) with outs a tuple of (sizes, dtype,
// npdtype, numel, strides or None: contiguous) or None per output, structure 0 one, 1 tuple, 2 list, 3 in place (the result
// is None: the caller returns the written argument: positional `returned`, else keyword `name`;
// -1: none), codes its runtime scalars' kinds
// a hit's counters: a cache hit and an execution, as the Python path counts them, and that it
// was served here
// A hit served here counts as a cache hit, an execution and a native hit in metrics' counters.
// Three boxed-int dict updates per hit were ~2 % of a strict 16x16 add: they are counted here
// and added to the dict when it is read or reset (flush_counts, metrics' flusher).
long long unflushed_hits = 0;

int count_hit() {
  ++unflushed_hits;
  return 0;
}

// the hits counted since the last flush, into metrics' counters; -1 with an error set
int flush_hits() {
  const long long n = unflushed_hits;
  if (n == 0 || !st.counts) return 0;
  unflushed_hits = 0;
  if (add_to(st.counts, s_cache_hits, n) < 0 || add_to(st.counts, s_executions, n) < 0) return -1;
  return add_to(st.counts, s_native_hits, n);
}

PyObject* flush_counts(PyObject*, PyObject*) {
  if (flush_hits() < 0) return nullptr;
  Py_RETURN_NONE;
}

// leaf.commit: each written storage (slot -> new array in `updated`) takes its new buffer; an
// old one still being computed is parked for synchronize() (inflight.replaced), unless the
// program that wrote the new one took it as an input (`covered`): the new one is then
// computed after it, and synchronize() waiting for the new one waits for it (an is_deleted
// and an is_ready call less per in-place hit)
int commit(PyObject* entries, PyObject* updated, bool covered) {
  if (!PyDict_Check(updated)) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: an in-place program's writes are not a dict");
    return -1;
  }
  Py_ssize_t pos = 0;
  PyObject *slot, *b;
  while (PyDict_Next(updated, &pos, &slot, &b)) {
    const Py_ssize_t i = PyLong_AsSsize_t(slot);
    if (i < 0 || i >= PyList_GET_SIZE(entries)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a write past the call's storages");
      return -1;
    }
    PyObject* entry = PyList_GET_ITEM(entries, i);
    PyObject* old = entry_buf(entry);
    if (!old) return -1;
    if (PyObject_SetAttr(entry, s_buf, b) < 0) {
      Py_DECREF(old);
      return -1;
    }
    int rc = 0;
    if (!covered && old != b && Py_TYPE(old) == st.array_type) {
      const int ready = array_ready(old);
      if (ready < 0) rc = -1;
      else if (!ready) {
        PyObject* r = PyObject_CallMethodOneArg(st.parked, s_append, old);
        if (!r) rc = -1;
        Py_XDECREF(r);
      }
    }
    Py_DECREF(old);
    if (rc < 0) return -1;
  }
  return 0;
}

// A planned output (compiled.hit's and compiled.rec's spec: sizes, dtype, npdtype, numel,
// strides or None: contiguous) as a new tensor on device 0 whose storage entry holds `buf`; its
// entry too when `entry` is given (a new reference each); nullptr with an error set
PyObject* planned_output(PyObject* spec, PyObject* buf, PyObject** entry) {
  PyObject* shape = PyTuple_GET_ITEM(spec, 0);
  const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
  std::vector<int64_t> sizes(nd);
  for (Py_ssize_t d = 0; d < nd; ++d) sizes[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
  const long long numel = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 3));
  PyObject* layout = PyTuple_GET_ITEM(spec, 4);
  std::vector<int64_t> strides;
  if (layout != Py_None) {
    strides.resize(nd);
    for (Py_ssize_t d = 0; d < nd; ++d) strides[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, d));
  }
  if (PyErr_Occurred()) return nullptr;
  try {
    at::Tensor t = make_empty(sizes, reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(spec, 1))->scalar_type,
                              layout != Py_None ? &strides : nullptr);
    PyObject* e = attach(t, numel, PyTuple_GET_ITEM(spec, 2), buf);
    if (!e) return nullptr;
    PyObject* obj = THPVariable_Wrap(std::move(t));
    if (obj && entry) *entry = e;
    else Py_DECREF(e);
    return obj;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

// a planned call's outputs (a tuple, stolen) as its structure says: 0 the one, 1 the tuple, 2 a list
PyObject* structured(PyObject* results, long structure) {
  if (structure == 0) {
    PyObject* one = PyTuple_GET_ITEM(results, 0);
    Py_INCREF(one);
    Py_DECREF(results);
    return one;
  }
  if (structure == 2) {
    PyObject* lst = PySequence_List(results);
    Py_DECREF(results);
    return lst;
  }
  return results;
}

// an eager op program's output tree, ((outs...), {slot: write, ...}, None), from its leaves
// (a list) as direct.py's form (n, slots) says, without the pytree's unflatten; nullptr, no
// error set, where the leaves are not as many as the form says
PyObject* formed(PyObject* form, PyObject* leaves) {
  if (!PyList_Check(leaves)) return nullptr;
  const Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(form, 0));
  PyObject* slots = PyTuple_GET_ITEM(form, 1);
  const Py_ssize_t nw = PyTuple_GET_SIZE(slots);
  if (n < 0 || PyList_GET_SIZE(leaves) != n + nw) return nullptr;
  PyObject* ot = PyTuple_New(n);
  for (Py_ssize_t i = 0; ot && i < n; ++i) {
    Py_INCREF(PyList_GET_ITEM(leaves, i));
    PyTuple_SET_ITEM(ot, i, PyList_GET_ITEM(leaves, i));
  }
  PyObject* writes = ot ? PyDict_New() : nullptr;
  for (Py_ssize_t i = 0; writes && i < nw; ++i) {
    if (PyDict_SetItem(writes, PyTuple_GET_ITEM(slots, i), PyList_GET_ITEM(leaves, n + i)) < 0) Py_CLEAR(writes);
  }
  PyObject* r = writes ? PyTuple_Pack(3, ot, writes, Py_None) : nullptr;
  Py_XDECREF(ot);
  Py_XDECREF(writes);
  return r;
}

// the program's executable called on `bufs` (a tuple or list; None items are no arguments, as
// in the jitted function's pytree) and the packed scalars (None or a tuple), without jax.jit's
// dispatch (runtime/direct.py): direct = (execute_sharded, handlers, unflatten, precision, form);
// what the jitted function returns, or Py_NotImplemented (a new reference, no error) where an
// argument is not a JAX array (the jitted function takes those: it converts host arrays) or
// torch's float32 matmul precision is not the one the executable was compiled under (jax.jit's
// key has it: it compiles or finds the program for this one)
PyObject* call_direct(PyObject* direct, PyObject* bufs, PyObject* packed) {
  if (packed != Py_None && !PyTuple_Check(packed)) Py_RETURN_NOTIMPLEMENTED;
  if (PyLong_AsLong(PyTuple_GET_ITEM(direct, 3)) != static_cast<long>(at::globalContext().float32MatmulPrecision()))
    Py_RETURN_NOTIMPLEMENTED;
  PyObject* parts[] = {bufs, packed};
  PyObject* flat = PyList_New(0);
  if (!flat) return nullptr;
  for (PyObject* part : parts) {
    if (part == Py_None) continue;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(part);
    PyObject** items = PySequence_Fast_ITEMS(part);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (items[i] == Py_None) continue;
      if (Py_TYPE(items[i]) != st.array_type) {
        Py_DECREF(flat);
        Py_RETURN_NOTIMPLEMENTED;
      }
      if (PyList_Append(flat, items[i]) < 0) {
        Py_DECREF(flat);
        return nullptr;
      }
    }
  }
  PyObject* results = PyObject_CallOneArg(PyTuple_GET_ITEM(direct, 0), flat);
  Py_DECREF(flat);
  if (!results) return nullptr;
  PyObject* outs = PyObject_CallMethodOneArg(results, s_consume, PyTuple_GET_ITEM(direct, 1));
  Py_DECREF(results);
  if (!outs) return nullptr;
  PyObject* form = PyTuple_GET_SIZE(direct) > 4 ? PyTuple_GET_ITEM(direct, 4) : Py_None;
  PyObject* r = form != Py_None ? formed(form, outs) : nullptr;
  if (!r && !PyErr_Occurred()) r = PyObject_CallOneArg(PyTuple_GET_ITEM(direct, 2), outs);
  Py_DECREF(outs);
  return r;
}

// compiled.hit run on the entries' buffers; NotImplemented where the Python path must serve.
// `read`: compiled.hit as the caller read it (borrowed), or nullptr: read here
PyObject* serve(PyObject* compiled, PyObject* entries, PyObject* packed, PyObject* read = nullptr) {
  PyObject* plan = read ? read : PyObject_GetAttr(compiled, s_hit);
  if (!plan) return nullptr;
  if (read) Py_INCREF(plan);
  if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 7) {
    Py_DECREF(plan);
    return not_here();
  }
  PyObject* fn = PyTuple_GET_ITEM(plan, 0);
  PyObject* outs = PyTuple_GET_ITEM(plan, 1);
  const long structure = PyLong_AsLong(PyTuple_GET_ITEM(plan, 2));
  // the entries' buffers: computed JAX arrays only (a pending, failed or unwritten one: the
  // Python path, which materializes, raises or refuses it)
  const Py_ssize_t ne = PyList_GET_SIZE(entries);
  PyObject* bufs = PyTuple_New(ne);
  if (!bufs) {
    Py_DECREF(plan);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < ne; ++i) {
    PyObject* b = entry_buf(PyList_GET_ITEM(entries, i));
    if (!b) {
      Py_DECREF(bufs);
      Py_DECREF(plan);
      return nullptr;
    }
    PyTuple_SET_ITEM(bufs, i, b);
    if (Py_TYPE(b) != st.array_type) {
      Py_DECREF(bufs);
      Py_DECREF(plan);
      return not_here();
    }
  }
  PyObject* now = PyIter_Next(st.clock);  // the cache's LRU clock: this use
  if (!now || PyObject_SetAttr(compiled, s_used, now) < 0) {
    Py_XDECREF(now);
    Py_DECREF(bufs);
    Py_DECREF(plan);
    return nullptr;
  }
  Py_DECREF(now);
  PyObject* direct = PyTuple_GET_ITEM(plan, 6);
  PyObject* r = direct != Py_None ? call_direct(direct, bufs, packed) : nullptr;
  // the executable took every buffer (direct.py plans none that prunes one), so its writes
  // are computed after the buffers they replace (PJRT runs a program once its inputs are)
  const bool covered = direct != Py_None && r != Py_NotImplemented;
  if (direct == Py_None || r == Py_NotImplemented) {
    Py_XDECREF(r);
    r = PyObject_CallFunctionObjArgs(fn, bufs, packed, empty_tuple, nullptr);
  }
  Py_DECREF(bufs);
  if (!r) {
    Py_DECREF(plan);
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // KeyboardInterrupt, ...
    PyErr_Clear();  // the Python path runs it again and reports it as it does
    return not_here();
  }
  if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3 || PyTuple_GET_ITEM(r, 2) != Py_None) {
    Py_DECREF(r);
    Py_DECREF(plan);
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a planned op's program returned check flags");
    return nullptr;
  }
  if (structure == 3) {  // in place: the written storages take their new buffers (leaf.commit)
    int rc = commit(entries, PyTuple_GET_ITEM(r, 1), covered);
    Py_DECREF(r);
    Py_DECREF(plan);
    if (rc < 0 || count_hit() < 0) return nullptr;
    Py_RETURN_NONE;
  }
  PyObject* arrs = PySequence_Fast(PyTuple_GET_ITEM(r, 0), "hit: outputs");
  Py_DECREF(r);
  if (!arrs) {
    Py_DECREF(plan);
    return nullptr;
  }
  const Py_ssize_t no = PyTuple_GET_SIZE(outs);
  PyObject* results = nullptr;
  if (count_hit() < 0 || tidy_parked() < 0)
    goto fail;
  results = PyTuple_New(no);
  if (!results) goto fail;
  {
    Py_ssize_t k = 0;
    const Py_ssize_t na = PySequence_Fast_GET_SIZE(arrs);
    for (Py_ssize_t i = 0; i < no; ++i) {
      PyObject* spec = PyTuple_GET_ITEM(outs, i);
      if (spec == Py_None) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(results, i, Py_None);
        continue;
      }
      if (k >= na) {
        PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: fewer outputs than planned");
        goto fail;
      }
      PyObject* obj = planned_output(spec, PySequence_Fast_GET_ITEM(arrs, k), nullptr);
      if (!obj) goto fail;
      PyTuple_SET_ITEM(results, i, obj);
      ++k;
    }
  }
  Py_DECREF(arrs);
  Py_DECREF(plan);
  return structured(results, structure);
fail:
  Py_XDECREF(results);
  Py_DECREF(arrs);
  Py_DECREF(plan);
  return nullptr;
}

PyObject* hit(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 3 || !PyList_CheckExact(a[1])) {
    PyErr_SetString(PyExc_TypeError, "hit(compiled, entries, packed)");
    return nullptr;
  }
  if (!configured()) return nullptr;
  return serve(a[0], a[1], a[2]);
}

// ---- the quick key's memo ---------------------------------------------------------------
//
// A call's quick key is nested tuples (five per tensor argument) made, hashed and compared
// with the stored one per call: ~11 % of a strict 16x16 add under perf. The walk also writes
// the key as bytes (walk.h's Walk::sig; equal bytes, equal keys), and the memo maps those
// bytes to the Python key they stand for and what the op cache's by_quick_key held under it.
// That object is taken as is while the dict has not changed since (its version tag, PEP 509:
// any insertion, deletion or clear moves it), so it is still the dict's (borrowed, never kept
// alive by the memo); after a change the memo's Python key is looked up again (a hash and a
// compare, no walk). A call not in the memo makes its Python key as before.
struct Memo {
  PyObject* key;    // the Python key (strong: it also holds the objects whose addresses the bytes name)
  PyObject* state;  // the lowering's state, named by its address (strong)
  PyObject* found;  // by_quick_key[key] when the dict's version was `version` (borrowed)
  uint64_t version;
};
std::unordered_map<std::string, Memo> memo;
constexpr size_t MEMO_MAX = 4096;  // then it starts over (a signature per entry, ~100 bytes)

#if PY_VERSION_HEX < 0x030C0000
constexpr bool MEMO_ON = true;
uint64_t dict_version(PyObject* d) { return reinterpret_cast<PyDictObject*>(d)->ma_version_tag; }
#else  // (ma_version_tag is deprecated from 3.12: no memo there)
constexpr bool MEMO_ON = false;
uint64_t dict_version(PyObject*) { return 0; }
#endif

void memo_clear() {
  for (auto& kv : memo) {
    Py_DECREF(kv.second.key);
    Py_DECREF(kv.second.state);
  }
  memo.clear();
}

// what the memo knows for `sig` in `quick` (borrowed, its Python key in *key, a new
// reference), nullptr where it knows nothing (an error set where the lookup raised)
PyObject* memo_find(const std::string& sig, PyObject* quick, PyObject** key) {
  auto it = memo.find(sig);
  if (it == memo.end()) return nullptr;
  Memo& m = it->second;
  const uint64_t now = dict_version(quick);
  if (m.version != now) {  // the dict changed: is the key still there, and with what
    PyObject* found = PyDict_GetItemWithError(quick, m.key);
    if (!found) {
      Py_DECREF(m.key);
      Py_DECREF(m.state);
      memo.erase(it);
      return nullptr;
    }
    m.found = found;
    m.version = now;
  }
  Py_INCREF(m.key);
  *key = m.key;
  return m.found;
}

void memo_note(const std::string& sig, PyObject* state, PyObject* key, PyObject* found, PyObject* quick) {
  if (memo.size() >= MEMO_MAX) memo_clear();
  Py_INCREF(key);
  Py_INCREF(state);
  auto [it, fresh] = memo.try_emplace(sig, Memo{key, state, found, dict_version(quick)});
  if (!fresh) {  // (not found there a moment ago: only a re-entered call could have added it)
    Py_DECREF(it->second.key);
    Py_DECREF(it->second.state);
    it->second = Memo{key, state, found, dict_version(quick)};
  }
}

PyObject* memo_size(PyObject*, PyObject*) { return PyLong_FromSize_t(memo.size()); }

// ---- the whole call: gate, key, hit ----------------------------------------------------

struct Gate {
  PyObject* quick = nullptr;         // the op cache's by_quick_key
  PyObject* mode_state = nullptr;    // eager/modes.state: {"mode": ...}
  PyObject* spread = nullptr;        // placement.SPREAD: [more than tpu:0 in use]
  PyObject* carried_seen = nullptr;  // jaxenv.CARRIED_SEEN: [a carried dtype seen]
  PyObject* dynamic = nullptr;       // executor.DYNAMIC: [its "dynamic" interceptor or None]
  PyObject* checks = nullptr;        // ops/checks.enabled_cell: [device-side checks on]
  PyObject* carried = nullptr;       // jaxenv.CARRIED: the carried dtypes
  PyObject* profiler = nullptr;      // torch.autograd.profiler (its _is_profiler_enabled)
  PyObject* sync = nullptr;          // () -> None: precision.sync with the executor's flush
  PyObject* pack = nullptr;          // scalars.pack_cached(values, codes)
  PyObject* exact = nullptr;         // scalars._exact: pack_cached's packs by (codes, values)
  PyObject* resume = nullptr;        // executor.resume(low, args, kwargs, key, compiled, entries, offsets, dyn, tensors)
  int precision = -1;                // float32 matmul precision at the last sync
  PyObject* precision_name = nullptr;  // torch.get_float32_matmul_precision() then
  PyObject* get_precision = nullptr;   // torch.get_float32_matmul_precision
  PyObject* pack_offsets = nullptr;    // offsets -> what a compiled graph's program takes
  PyObject* bucketed = nullptr;        // eager/extents.Bucketed: what a quick key finds for a bucketed view
} gate;

PyObject* s_mode;
PyObject* s_strict;
PyObject* s_device;
PyObject* s_dtype_kw;
PyObject* s_profiling;
PyObject* s_deferring;
PyObject* s_rec;
PyObject* s_fits;
PyObject* s_compiled;
PyObject* s_sizes;
PyObject* s_bucketed_view_ops;

bool cell(PyObject* lst) {  // a one-item list's item, as a truth value
  return PyList_GET_SIZE(lst) > 0 && PyObject_IsTrue(PyList_GET_ITEM(lst, 0)) == 1;
}

PyObject* configure_fast(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 15) {
    PyErr_SetString(PyExc_TypeError, "configure_fast: 15 arguments");
    return nullptr;
  }
  for (int i : {2, 3, 4, 5}) {
    if (!PyList_CheckExact(a[i])) {
      PyErr_SetString(PyExc_TypeError, "configure_fast: state cells must be lists");
      return nullptr;
    }
  }
  if (!PyDict_CheckExact(a[0])) {  // (the memo reads its version tag)
    PyErr_SetString(PyExc_TypeError, "configure_fast: the quick keys' cache must be a dict");
    return nullptr;
  }
  if (!PyType_Check(a[13]) || !PyDict_CheckExact(a[14])) {
    PyErr_SetString(PyExc_TypeError, "configure_fast: the Bucketed type, then the packs by key (a dict)");
    return nullptr;
  }
  PyObject** slots[] = {&gate.quick, &gate.mode_state, &gate.spread, &gate.carried_seen,
                        &gate.dynamic, &gate.checks, &gate.carried, &gate.profiler,
                        &gate.sync, &gate.pack, &gate.resume, &gate.get_precision,
                        &gate.pack_offsets, &gate.bucketed, &gate.exact};
  for (int i = 0; i < 15; ++i) {
    Py_INCREF(a[i]);
    Py_XSETREF(*slots[i], a[i]);
  }
  gate.precision = -1;
  memo_clear();  // (what it found was another dict's)
  Py_RETURN_NONE;
}

// torch's float32 matmul precision changed since the last call: JAX follows it (precision.sync)
// and its name (part of a compiled graph's key) is read again; -1 with an error set
int sync_precision() {
  const int precision = static_cast<int>(at::globalContext().float32MatmulPrecision());
  if (precision == gate.precision) return 0;
  PyObject* r = PyObject_CallNoArgs(gate.sync);
  if (!r) return -1;
  Py_DECREF(r);
  PyObject* name = PyObject_CallNoArgs(gate.get_precision);
  if (!name) return -1;
  Py_XSETREF(gate.precision_name, name);
  gate.precision = precision;
  return 0;
}

// what an in-place op returns: its written argument, positional `index`, else keyword `name`
// (index -1: None); a new reference
PyObject* written_argument(PyObject* args, PyObject* kwargs, PyObject* index, PyObject* name) {
  const long i = PyLong_AsLong(index);
  PyObject* out;
  if (i < 0) out = PyErr_Occurred() ? nullptr : Py_None;
  else if (i < PyTuple_GET_SIZE(args)) out = PyTuple_GET_ITEM(args, i);
  else out = kwargs ? PyDict_GetItemWithError(kwargs, name) : nullptr;
  if (out) Py_INCREF(out);
  else if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: the written argument is missing");
  return out;
}

// `out` of a planned call (nullptr and NotImplemented pass through): for an in-place plan
// (plan[structure_at] == 3) the written argument instead, named by plan[returned_at] (its
// position) and plan[returned_at + 1] (its keyword); steals `out`
PyObject* planned_result(PyObject* out, PyObject* plan, int structure_at, int returned_at, PyObject* args,
                         PyObject* kwargs) {
  if (!out || out == Py_NotImplemented || PyLong_AsLong(PyTuple_GET_ITEM(plan, structure_at)) != 3) return out;
  Py_DECREF(out);
  return written_argument(args, kwargs, PyTuple_GET_ITEM(plan, returned_at), PyTuple_GET_ITEM(plan, returned_at + 1));
}

#include "record.h"

// whether one of the call's storage entries is among `marked` (a dict keyed by weak references:
// eager/dynamism.py's storages of dynamic tensors); -1 with an error set. An entry without weak
// references (a 0-dim CPU operand's) is none of them.
int over_marked(PyObject* entries, PyObject* marked) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); ++i) {
    PyObject* e = PyList_GET_ITEM(entries, i);
    if (!PyType_SUPPORTS_WEAKREFS(Py_TYPE(e))) continue;
    PyObject* ref = PyWeakref_NewRef(e, nullptr);  // (the object's basic reference, reused)
    if (!ref) return -1;
    const int in = PyDict_Contains(marked, ref);
    Py_DECREF(ref);
    if (in) return in;
  }
  return 0;
}

// a planned call's runtime values: its scalars, then its views' offsets, then (a view written
// over its bucket) the true sizes; a new reference
PyObject* runtime_values(PyObject* dyn, PyObject* offsets, PyObject* sizes) {
  PyObject* vals = PyList_GET_SIZE(offsets) ? PySequence_Concat(dyn, offsets) : (Py_INCREF(dyn), dyn);
  if (vals && sizes) {
    PyObject* tail = PySequence_List(sizes);
    PyObject* all = tail ? PySequence_Concat(vals, tail) : nullptr;
    Py_XDECREF(tail);
    Py_SETREF(vals, all);
  }
  return vals;
}

// scalars.pack_cached's common case: the device arrays it keeps for (codes, values), found
// without calling it (a new reference); nullptr, no error set, where it has none (it is then
// called: it decides what may be kept; only its own entries are in the dict, so a value it
// never keeps, a float zero or NaN, finds nothing here)
PyObject* cached_pack(PyObject* vals, PyObject* codes) {
  PyObject* tv = PySequence_Tuple(vals);
  PyObject* key = tv ? PyTuple_Pack(2, codes, tv) : nullptr;
  Py_XDECREF(tv);
  if (!key) return nullptr;
  PyObject* got = PyDict_GetItemWithError(gate.exact, key);  // borrowed
  Py_DECREF(key);
  Py_XINCREF(got);
  return got;
}


// fast(state, args, kwargs) -> result | NotImplemented
//   state: (low, name, mode, scan_info) of one lowering. The call, served whole where it is a
//   strict cache hit with a plan, or recorded (record.h) where defer_and_fuse records a signature
//   with a record plan; else handed to executor.resume with its key and scan, so the
//   Python path does not walk it again; NotImplemented where the executor's full path must see
//   it first (what eager/executor.execute does before its quick key: carried dtypes, several
//   devices, dynamic dims, a device= or carried dtype= keyword, an argument the walk does not
//   read)
PyObject* fast(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(a[0]) || PyTuple_GET_SIZE(a[0]) != 4 || !PyTuple_Check(a[1])) {
    PyErr_SetString(PyExc_TypeError, "fast(state, args, kwargs)");
    return nullptr;
  }
  if (!gate.quick || !configured()) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: configure_fast() was not called");
    return nullptr;
  }
  PyObject* state = a[0];
  PyObject* args = a[1];
  PyObject* kwargs = (a[2] != Py_None && PyDict_GET_SIZE(a[2]) > 0) ? a[2] : nullptr;
  if (cell(gate.carried_seen) || cell(gate.spread)) return not_here();
  // dynamic tensors exist: the walk's storages are looked up among theirs (below)
  PyObject* marked = nullptr;
  if (PyList_GET_ITEM(gate.dynamic, 0) != Py_None) {
    marked = PyList_GET_SIZE(gate.dynamic) > 1 ? PyList_GET_ITEM(gate.dynamic, 1) : nullptr;
    if (!marked || !PyDict_Check(marked)) return not_here();
  }
  if (kwargs) {
    if (PyDict_GetItemWithError(kwargs, s_device)) return not_here();
    PyObject* dt = PyDict_GetItemWithError(kwargs, s_dtype_kw);
    if (PyErr_Occurred()) return nullptr;
    if (dt) {
      int c = PySequence_Contains(gate.carried, dt);
      if (c < 0) return nullptr;
      if (c) return not_here();
    }
  }
  if (sync_precision() < 0) return nullptr;
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(c10::get_default_dtype_as_scalartype()));
  PyObject* checks = PyList_GET_ITEM(gate.checks, 0);
  PyObject* entries = PyList_New(0);
  PyObject* offsets = PyList_New(0);
  PyObject* dyn = PyList_New(0);
  PyObject* tensors = PyList_New(0);
  PyObject* key = nullptr;
  PyObject* out = nullptr;
  PyObject* compiled = nullptr;
  PyObject* bucketed = nullptr;  // an extents.Bucketed the key found (`compiled`: its program, if it fits)
  PyObject* sizes = nullptr;     // its true sizes, riding after the offsets
  if (!entries || !offsets || !dyn || !tensors) goto done;
  {
    // First the key as bytes (its head: the lowering's state, device-side checks, the default
    // dtype), looked up in the memo; where the memo does not know them (or cannot be asked:
    // another CPython, a checks flag other than a bool), the Python key.
    const bool memo_on = MEMO_ON && (checks == Py_True || checks == Py_False);
    thread_local std::string sig;
    bool flat_ok = false;
    if (memo_on) {
      sig.clear();
      Walk w{st.table, entries, offsets, dyn, tensors, {}};
      w.sig = &sig;
      w.build = false;
      put(w, static_cast<const void*>(state));
      put(w, static_cast<char>(checks == Py_True));
      put(w, static_cast<const void*>(dtype));
      PyObject* walked = walk_key(w, Py_None, args, kwargs ? kwargs : Py_None, PyTuple_GET_ITEM(state, 3));
      if (!walked) goto done;
      Py_DECREF(walked);
      if (walked == Py_None) {  // an argument the walk does not read: the full path
        out = not_here();
        goto done;
      }
      flat_ok = w.flat_ok;
      // (the walk made no object the cyclic GC tracks: no finalizer has run an op reusing
      // `sig` or emptied the cache before what the memo found is held)
      PyObject* found = flat_ok ? memo_find(sig, gate.quick, &key) : nullptr;  // borrowed
      if (!found && PyErr_Occurred()) goto done;
      compiled = found;  // held while Python runs below (a finalizer or a thread may empty the cache)
      Py_XINCREF(compiled);
    }
    if (!key) {  // not found by the memo: the Python key, the lists walked (again) with it
      // (its tuples may start a collection whose finalizers run ops here: the bytes copied first)
      const std::string flat = flat_ok ? sig : std::string();
      PyObject* head = PyTuple_Pack(4, PyTuple_GET_ITEM(state, 1), PyTuple_GET_ITEM(state, 2), checks, dtype);
      if (!head) goto done;
      PyObject* lists[] = {entries, offsets, dyn, tensors};
      for (PyObject* l : lists) {
        if (PyList_SetSlice(l, 0, PyList_GET_SIZE(l), nullptr) < 0) {
          Py_DECREF(head);
          goto done;
        }
      }
      Walk w{st.table, entries, offsets, dyn, tensors, {}};
      key = walk_key(w, head, args, kwargs ? kwargs : Py_None, PyTuple_GET_ITEM(state, 3));
      Py_DECREF(head);
      if (!key) goto done;
      if (key == Py_None) {  // an argument the walk does not read: the full path
        out = not_here();
        goto done;
      }
      compiled = PyDict_GetItemWithError(gate.quick, key);
      if (!compiled && PyErr_Occurred()) goto done;
      Py_XINCREF(compiled);
      if (compiled && flat_ok) memo_note(flat, state, key, compiled, gate.quick);
    }
    if (marked) {
      const int over = over_marked(entries, marked);
      if (over < 0) goto done;
      if (over) {  // the interceptor serves it (eager/dynamism.py)
        out = not_here();
        goto done;
      }
    }
  }
  {
    if (compiled && Py_TYPE(compiled) == reinterpret_cast<PyTypeObject*>(gate.bucketed)) {
      // a view written over its bucket: its program, with the true sizes after the offsets,
      // where this call plans as the one it was found for did (else resume() plans it again)
      bucketed = compiled;
      compiled = nullptr;
      PyObject* ok = PyObject_CallMethodOneArg(bucketed, s_fits, offsets);
      const int fits = ok ? PyObject_IsTrue(ok) : -1;
      Py_XDECREF(ok);
      if (fits < 0) goto done;
      if (fits) {
        sizes = PyObject_GetAttr(bucketed, s_sizes);
        if (!sizes) goto done;
        compiled = PyObject_GetAttr(bucketed, s_compiled);
        if (!compiled) goto done;
      }
    }
    if (compiled) {
      PyObject* mode = PyDict_GetItemWithError(gate.mode_state, s_mode);
      if (!mode) goto done;
      const bool strict = PyUnicode_Check(mode) && PyUnicode_Compare(mode, s_strict) == 0;
      PyObject* plan = nullptr;
      if (strict) {  // (the profiler times strict runs: the Python path serves those)
        PyObject* prof = PyObject_GetAttr(gate.profiler, s_profiling);
        if (!prof) goto done;
        const int profiling = PyObject_IsTrue(prof);
        Py_DECREF(prof);
        plan = profiling == 0 ? PyObject_GetAttr(compiled, s_hit) : nullptr;
      } else if (rec.globals && PyUnicode_Check(mode) && PyUnicode_Compare(mode, s_deferring) == 0) {
        // defer_and_fuse: recorded here where its signature has a record plan
        plan = PyObject_GetAttr(compiled, s_rec);
        if (plan && PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) == 5) {
          PyObject* vals = runtime_values(dyn, offsets, sizes);  // offsets ride last, a bucket's sizes after them
          out = vals ? record_planned(compiled, plan, entries, vals, PyTuple_GET_ITEM(state, 1)) : nullptr;
          if (out && out != Py_NotImplemented && sizes && add_to(st.counts, s_bucketed_view_ops, 1) < 0) Py_CLEAR(out);
          Py_XDECREF(vals);
          out = planned_result(out, plan, 1, 3, args, kwargs);
          Py_DECREF(plan);
          if (!out) goto done;
          if (out != Py_NotImplemented) goto done;
          Py_CLEAR(out);
        } else {
          Py_XDECREF(plan);
          if (PyErr_Occurred()) goto done;
        }
        plan = nullptr;
      }
      if (plan && PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) == 7) {
        PyObject* packed;
        if (PyList_GET_SIZE(dyn) || PyList_GET_SIZE(offsets) || sizes) {
          PyObject* vals = runtime_values(dyn, offsets, sizes);  // offsets ride after the scalars
          packed = vals ? cached_pack(vals, PyTuple_GET_ITEM(plan, 3)) : nullptr;
          if (vals && !packed && !PyErr_Occurred())
            packed = PyObject_CallFunctionObjArgs(gate.pack, vals, PyTuple_GET_ITEM(plan, 3), nullptr);
          Py_XDECREF(vals);
        } else {
          packed = Py_None;  // (what scalars.pack_cached gives for no values)
          Py_INCREF(packed);
        }
        if (packed) out = serve(compiled, entries, packed, plan);
        Py_XDECREF(packed);
        if (out && out != Py_NotImplemented && sizes && add_to(st.counts, s_bucketed_view_ops, 1) < 0) Py_CLEAR(out);
        out = planned_result(out, plan, 2, 4, args, kwargs);
        Py_DECREF(plan);
        if (!out) goto done;
        if (out != Py_NotImplemented) goto done;
        Py_CLEAR(out);
      } else {
        Py_XDECREF(plan);
        if (PyErr_Occurred()) goto done;
      }
    }
    PyObject* found = bucketed ? bucketed : compiled;
    PyObject* rargs[] = {PyTuple_GET_ITEM(state, 0), args, a[2], key, found ? found : Py_None,
                         entries, offsets, dyn, tensors};
    out = PyObject_Vectorcall(gate.resume, rargs, 9, nullptr);
  }
done:
  Py_XDECREF(compiled);
  Py_XDECREF(bucketed);
  Py_XDECREF(sizes);
  Py_XDECREF(key);
  Py_XDECREF(entries);
  Py_XDECREF(offsets);
  Py_XDECREF(dyn);
  Py_XDECREF(tensors);
  return out;
}

#include "kernel.h"
#include "boxed.h"
#include "views.h"

// ---- a compiled graph's call -----------------------------------------------------------

// compile/runtime._quick_scan's key item of one graph input, or NotImplemented (a CPU tensor, a
// tensor without an entry, a NaN, another type: the Python path), the entry and offset noted
PyObject* graph_item(PyObject* v, PyObject** entry, int64_t* off) {
  *entry = nullptr;
  *off = 0;
  if (v == Py_None) {
    Py_INCREF(v);
    return v;
  }
  if (exact_number(v)) {
    if (is_nan(v)) return bail();
    return PyTuple_Pack(2, v, reinterpret_cast<PyObject*>(Py_TYPE(v)));
  }
  if (!THPVariable_Check(v)) return bail();
  const at::Tensor& t = THPVariable_Unpack(v);
  if (!t.defined() || t.device().type() != kType || !t.has_storage()) return bail();
  PyObject* addr = PyLong_FromVoidPtr(t.storage().unsafeGetStorageImpl());
  if (!addr) return nullptr;
  PyObject* e = PyDict_GetItemWithError(st.table, addr);  // borrowed
  Py_DECREF(addr);
  if (!e) return PyErr_Occurred() ? nullptr : bail();
  PyObject* numel = PyObject_GetAttr(e, s_numel);
  PyObject* npdtype = numel ? PyObject_GetAttr(e, s_dtype) : nullptr;
  PyObject* sizes = npdtype ? int_tuple(t.sizes()) : nullptr;
  PyObject* strides = sizes ? int_tuple(t.strides()) : nullptr;
  PyObject* item = nullptr;
  if (strides) {
    *off = t.storage_offset();
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    item = PyTuple_Pack(8, numel, npdtype, sizes, strides, *off ? Py_True : Py_False, dtype,
                        t.is_neg() ? Py_True : Py_False, t.is_conj() ? Py_True : Py_False);
  }
  Py_XDECREF(numel);
  Py_XDECREF(npdtype);
  Py_XDECREF(sizes);
  Py_XDECREF(strides);
  if (item) *entry = e;
  return item;
}

// graph_fast(quick, args) -> results | NotImplemented
//   quick: the graph's programs by quick key (executables.by_quick_key), for a graph with no
//   symbolic sizes, host part, collectives, random ops or mutated inputs (CompiledGraph.native).
//   A call whose program was found by its key before and has a native plan (learned["native"]:
//   per output (0, sizes, dtype, npdtype, numel, strides | None) fresh, (1, i) the i-th input,
//   (2, j) the j-th output again, (3,) None) runs here, boxed: `args` is cleared. Else
//   NotImplemented: CompiledGraph._call serves it.
PyObject* graph_fast(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 2 || !PyDict_Check(a[0]) || !PyList_Check(a[1])) {
    PyErr_SetString(PyExc_TypeError, "graph_fast(quick, args)");
    return nullptr;
  }
  if (!gate.quick || !configured()) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: configure_fast() was not called");
    return nullptr;
  }
  PyObject* args = a[1];
  if (cell(gate.spread)) return not_here();
  if (sync_precision() < 0) return nullptr;
  const Py_ssize_t na = PyList_GET_SIZE(args);
  PyObject* key = PyTuple_New(na);
  PyObject* bufs = key ? PyList_New(na) : nullptr;
  PyObject* offsets = bufs ? PyList_New(0) : nullptr;
  PyObject* out = nullptr;
  PyObject* full = nullptr;
  PyObject* got = nullptr;
  PyObject* learned = nullptr;
  PyObject* plan = nullptr;
  PyObject* r = nullptr;
  PyObject* results = nullptr;
  if (!offsets) goto done;
  for (Py_ssize_t i = 0; i < na; ++i) {
    PyObject* e;
    int64_t off;
    PyObject* k = graph_item(PyList_GET_ITEM(args, i), &e, &off);
    if (!k) goto done;
    if (k == Py_NotImplemented) {
      out = k;
      goto done;
    }
    PyTuple_SET_ITEM(key, i, k);
    PyObject* b = Py_None;
    if (e) {
      b = entry_buf(e);
      if (!b) goto done;
      if (Py_TYPE(b) != st.array_type) {  // not computed yet: the Python path materializes it
        Py_DECREF(b);
        out = not_here();
        goto done;
      }
      if (off) {
        PyObject* o = PyLong_FromLongLong(off);
        if (!o || PyList_Append(offsets, o) < 0) {
          Py_XDECREF(o);
          Py_DECREF(b);
          goto done;
        }
        Py_DECREF(o);
      }
    } else {
      Py_INCREF(b);
    }
    PyList_SET_ITEM(bufs, i, b);
  }
  {
    PyObject* context = PyTuple_Pack(2, gate.precision_name, PyList_GET_ITEM(gate.checks, 0));
    full = context ? PyTuple_Pack(3, key, empty_tuple, context) : nullptr;  // (key, donated, context)
    Py_XDECREF(context);
    if (!full) goto done;
    got = PyDict_GetItemWithError(a[0], full);  // (fn, learned), held while Python runs
    if (!got) {
      if (!PyErr_Occurred()) out = not_here();
      goto done;
    }
    Py_INCREF(got);
    learned = PyTuple_GET_ITEM(got, 1);
    plan = PyDict_GetItemWithError(learned, s_native);  // borrowed
    if (!plan || !PyTuple_Check(plan)) {
      if (!PyErr_Occurred()) out = not_here();
      goto done;
    }
    PyObject* packed_offsets;
    if (PyList_GET_SIZE(offsets)) {
      packed_offsets = PyObject_CallOneArg(gate.pack_offsets, offsets);
      if (!packed_offsets) goto done;
    } else {
      packed_offsets = empty_tuple;
      Py_INCREF(packed_offsets);
    }
    // (its executable without jax.jit's dispatch where planned and no offsets ride along)
    PyObject* direct = PyList_GET_SIZE(offsets) ? nullptr : PyDict_GetItemWithError(learned, s_direct);
    if (!direct && PyErr_Occurred()) {
      Py_DECREF(packed_offsets);
      goto done;
    }
    r = direct && direct != Py_None ? call_direct(direct, bufs, Py_None) : nullptr;
    if (!direct || direct == Py_None || r == Py_NotImplemented) {
      Py_XDECREF(r);
      r = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(got, 0), empty_tuple, bufs, empty_tuple, empty_tuple,
                                       packed_offsets, nullptr);
    }
    Py_DECREF(packed_offsets);
    if (!r) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) goto done;
      PyErr_Clear();  // the Python path runs it again and reports it as it does
      out = not_here();
      goto done;
    }
  }
  {
    // (outs, written, packed host values, check flags): a planned graph writes nothing
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4 || PyTuple_GET_ITEM(r, 3) != Py_None ||
        PyTuple_GET_ITEM(r, 2) != Py_None || PyObject_IsTrue(PyTuple_GET_ITEM(r, 1)) != 0) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a planned graph's program wrote or checked");
      goto done;
    }
    PyObject* outs = PySequence_Fast(PyTuple_GET_ITEM(r, 0), "graph_fast: outputs");
    if (!outs) goto done;
    const Py_ssize_t np_ = PyTuple_GET_SIZE(plan);
    if (PySequence_Fast_GET_SIZE(outs) < np_) {
      Py_DECREF(outs);
      PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: fewer outputs than planned");
      goto done;
    }
    if (count_hit() < 0 || tidy_parked() < 0) {
      Py_DECREF(outs);
      goto done;
    }
    results = PyList_New(np_);
    if (!results) {
      Py_DECREF(outs);
      goto done;
    }
    for (Py_ssize_t i = 0; i < np_; ++i) {
      PyObject* spec = PyTuple_GET_ITEM(plan, i);
      const long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
      PyObject* obj = nullptr;
      if (kind == 1 || kind == 2) {
        const Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        obj = kind == 1 ? PyList_GET_ITEM(args, j) : PyList_GET_ITEM(results, j);
        Py_XINCREF(obj);
      } else if (kind == 3) {
        obj = Py_None;
        Py_INCREF(obj);
      } else {
        std::vector<int64_t> sizes, strides;
        const bool laid = PyTuple_GET_ITEM(spec, 5) != Py_None;
        if (!int_vector(PyTuple_GET_ITEM(spec, 1), sizes) || (laid && !int_vector(PyTuple_GET_ITEM(spec, 5), strides))) {
          Py_DECREF(outs);
          goto done;
        }
        const long long numel = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, 4));
        try {
          at::Tensor t = make_empty(sizes, reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(spec, 2))->scalar_type,
                                    laid ? &strides : nullptr);
          PyObject* entry = attach(t, numel, PyTuple_GET_ITEM(spec, 3), PySequence_Fast_GET_ITEM(outs, i));
          if (entry) {
            Py_DECREF(entry);
            obj = THPVariable_Wrap(std::move(t));
          }
        } catch (const std::exception& e) {
          PyErr_SetString(PyExc_RuntimeError, e.what());
        }
      }
      if (!obj) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torchtpu._hit: a planned output is missing");
        Py_DECREF(outs);
        goto done;
      }
      PyList_SET_ITEM(results, i, obj);
    }
    Py_DECREF(outs);
    if (PyList_SetSlice(args, 0, na, nullptr) < 0) goto done;  // boxed: the inputs are let go
    out = results;
    results = nullptr;
  }
done:
  Py_XDECREF(results);
  Py_XDECREF(r);
  Py_XDECREF(got);
  Py_XDECREF(full);
  Py_XDECREF(offsets);
  Py_XDECREF(bufs);
  Py_XDECREF(key);
  return out;
}

PyMethodDef methods[] = {
    {"configure_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure_fast)), METH_FASTCALL,
     "configure_fast(quick, mode_state, spread, carried_seen, dynamic, checks, carried, profiler, sync, pack, "
     "resume, get_precision, pack_offsets, bucketed, exact)"},
    {"graph_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(graph_fast)), METH_FASTCALL,
     "graph_fast(quick, args) -> results | NotImplemented"},
    {"fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast)), METH_FASTCALL,
     "fast(state, args, kwargs) -> result | NotImplemented"},
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure)), METH_FASTCALL,
     "configure(table, stats, counts, clock, parked, tidy, entry_type, array_type, lock, release, max_parked, "
     "tidy_step)"},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(new_tensor)), METH_FASTCALL,
     "new_tensor(shape, dtype, npdtype, buf) -> (tensor, entry)"},
    {"alias", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(alias)), METH_FASTCALL,
     "alias(base, shape, stride, offset, dtype) -> a view of base's storage"},
    {"configure_record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure_record)), METH_FASTCALL,
     "configure_record(globals, lock, node_type, pending_type, fused, replayed, internal, is_internal)"},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(record)), METH_FASTCALL,
     "record(compiled, entries, dyn, name) -> outputs | NotImplemented"},
    {"hit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(hit)), METH_FASTCALL,
     "hit(compiled, entries, packed) -> result | NotImplemented"},
    {"flush_counts", flush_counts, METH_NOARGS,
     "flush_counts(): the hits served since the last call, into metrics' counters"},
    {"memo_size", memo_size, METH_NOARGS, "memo_size(): how many quick keys the memo of their bytes holds"},
    {"register_view", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_view)), METH_FASTCALL,
     "register_view(name, kind, python_kernel): a C++ view kernel for an aten overload at PrivateUse1, "
     "python_kernel off its fast path (csrc/views.h)"},
    {"register_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_kernel)), METH_FASTCALL,
     "register_kernel(name, kernel): the Kernel as an aten overload's PrivateUse1 kernel (csrc/boxed.h)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hit",
                      "The host's hot paths in C++: an op's cache hit, a compiled graph's call, new tensors, views "
                      "(csrc/hit.cpp).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__hit(void) {
  s_hit = PyUnicode_InternFromString("hit");
  s_consume = PyUnicode_InternFromString("consume_with_handlers");
  s_direct = PyUnicode_InternFromString("direct");
  s_fits = PyUnicode_InternFromString("fits");
  s_compiled = PyUnicode_InternFromString("compiled");
  s_sizes = PyUnicode_InternFromString("sizes");
  s_bucketed_view_ops = PyUnicode_InternFromString("bucketed_view_ops");
  s_mode = PyUnicode_InternFromString("mode");
  s_strict = PyUnicode_InternFromString("strict");
  s_device = PyUnicode_InternFromString("device");
  s_dtype_kw = PyUnicode_InternFromString("dtype");
  s_profiling = PyUnicode_InternFromString("_is_profiler_enabled");
  s_deferring = PyUnicode_InternFromString("defer_and_fuse");
  s_rec = PyUnicode_InternFromString("rec");
  record_init();
  walk_init();
  s_used = PyUnicode_InternFromString("used");
  s_index = PyUnicode_InternFromString("index");
  s_addr = PyUnicode_InternFromString("addr");
  s_nbytes = PyUnicode_InternFromString("nbytes");
  s_append = PyUnicode_InternFromString("append");
  s_is_ready = PyUnicode_InternFromString("is_ready");
  s_is_deleted = PyUnicode_InternFromString("is_deleted");
  s_popleft = PyUnicode_InternFromString("popleft");
  s_appendleft = PyUnicode_InternFromString("appendleft");
  s_allocated = PyUnicode_InternFromString("allocated");
  s_peak = PyUnicode_InternFromString("peak");
  s_cache_hits = PyUnicode_InternFromString("cache_hits");
  s_executions = PyUnicode_InternFromString("executions");
  s_native_hits = PyUnicode_InternFromString("native_hits");
  s_native = PyUnicode_InternFromString("native");
  empty_tuple = PyTuple_New(0);
  s_zero_index = PyLong_FromLong(0);
  if (kernel_type_init() < 0 || gil_lock_type_init() < 0 ||
      ready_held_type(ReleaseType, "torchtpu.runtime._hit.Release", 2,
                      "What a storage made in C++ lets go when it dies: its key and entry (csrc/hit.cpp)",
                      nullptr) < 0)
    return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (!m) return nullptr;
  if (PyModule_AddObjectRef(m, "Kernel", reinterpret_cast<PyObject*>(&KernelType)) < 0 ||
      PyModule_AddObjectRef(m, "GilLock", reinterpret_cast<PyObject*>(&GilLockType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
