// The quick key of an op call, read off its arguments in one C++ pass.
//
// torchtpu's executors find the executable of a call seen before by a key made of what the
// call's program depends on: per tensor its storage (which of the call's storages, with that
// storage's element count, dtype and whether it was ever written), sizes, strides, whether
// its offset is nonzero, dtype and lazy conjugate/negative bits; per Python number its type
// (a runtime value) or its value (a static one); other arguments as they are.
// eager/op_args.scan states the rules; this is the same walk without a Python frame and a
// dozen attribute calls per tensor, which were most of the host time of a strict op's
// cache hit. It also collects what a hit needs: the storages' entries (each once, in
// first-seen order), nonzero offsets and runtime numbers, and the tensors (for errors).
//
// scan(head, args, kwargs, info, table, entries, offsets, dyn, tensors) -> key | None
//   head:    the key's first item (op name, mode, global state)
//   args:    the positional arguments (a tuple)
//   kwargs:  a dict or None
//   info:    (runtime, kinds, by_name): per position whether a number there is a runtime
//            value and its list kind (0 other, 1 a tensor list, 2 a scalar list); by_name
//            maps a keyword to (runtime, kind)
//   table:   runtime/storage.table (storage address -> entry with numel, dtype, buf)
//   entries, offsets, dyn, tensors: lists the walk appends to
// None: an argument it does not read (a CPU tensor, a tensor without an entry, a NaN where
// a static number is, another type): the caller takes its full path.
#include "walk.h"

namespace {

PyObject* scan(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 9) {
    PyErr_SetString(PyExc_TypeError, "scan: 9 arguments");
    return nullptr;
  }
  Walk w{a[4], a[5], a[6], a[7], a[8], {}};
  return walk_key(w, a[0], a[1], a[2], a[3]);
}
PyMethodDef methods[] = {
    {"scan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(scan)), METH_FASTCALL,
     "scan(head, args, kwargs, info, table, entries, offsets, dyn, tensors) -> key | None"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "The quick key of an op call (csrc/scan.cpp).", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__scan(void) {
  walk_init();
  return PyModule_Create(&module);
}
