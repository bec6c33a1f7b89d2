// The common view ops as C++ kernels for PrivateUse1: a view is a new TensorImpl over its base's
// storage with new sizes, strides and offset (what PyTorch's own CPU kernels build), computed
// here by stride arithmetic.
//
// Why: registered through torch.library, a view was a Python kernel behind PythonKernelHolder
// (the dispatcher's stack to Python objects, the kernel's frames, the result back), ~2.5 us for
// `a[3]` and ~4 us for one slice of `a[:5, :12]` against 0.7 and 0.9 on CPU (perf: the holder
// and the Python kernel 73 % of a slice). A row add `a[3] + b[5]` spent more in its two views
// than in the add.
//
// Scope: the calls the Python fast paths serve (eager/view_kernels.py's _FAST_VIEWS), with the
// same arithmetic, and as_strided (which PyTorch's composite views -- squeeze, diagonal,
// split_with_sizes, unbind -- end in) within the bytes the storage table holds; anything else -- a dim out of range, an index past the end, a negative step,
// a symbolic size, a 0-d tensor -- goes to the Python kernel it was registered with, which takes
// its meta path and raises PyTorch's own error. `view` and `_reshape_alias` run Meta's C++
// kernel, as the Python kernel did first, and go to Python where it throws (a growth's padded
// tensor: eager/dynamism.py).
//
// register_view(name, kind, python_kernel)
#pragma once

// (included inside hit.cpp's anonymous namespace, after boxed.h)
namespace {

enum ViewKind : int {
  kSelect = 0, kSlice, kT, kTranspose, kPermute, kUnsqueeze, kSqueezeDim, kExpand, kView, kReshapeAlias,
  kAsStrided, kViewKinds
};

// the bytes the storage table's entry holds for `t`'s storage (as_strided's bound), or -1 where
// there is none to read here (the Python kernel then decides, with its error)
long long table_nbytes(const at::Tensor& t) {
  pybind11::gil_scoped_acquire gil;
  if (!st.table || !entry_maker.type) return -1;
  PyObject* addr = PyLong_FromVoidPtr(t.storage().unsafeGetStorageImpl());
  PyObject* entry = addr ? PyDict_GetItemWithError(st.table, addr) : nullptr;  // borrowed
  Py_XDECREF(addr);
  PyObject* nb = entry ? slot_read(entry, entry_maker.type, entry_maker.offsets[3], s_nbytes) : nullptr;
  long long n = nb && PyLong_CheckExact(nb) ? PyLong_AsLongLong(nb) : -1;
  Py_XDECREF(nb);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    n = -1;
  }
  return n;
}

// a dim in [-n, n) as a non-negative one; -1 off the fast path (n == 0 included)
int64_t view_dim(int64_t d, int64_t n) {
  if (n <= 0 || d < -n || d >= n) return -1;
  return d < 0 ? d + n : d;
}

// an int argument, or false (a SymInt that is symbolic, or another type)
bool view_int(const c10::IValue& v, int64_t& out) {
  if (!v.isInt()) return false;
  out = v.toInt();
  return true;
}

// a view of `self`'s storage: its dispatch keys (a lazy conjugate or negative bit among them)
// and dtype, as PyTorch's alias_with_sizes_and_strides and as_strided_tensorimpl make one
at::Tensor view_of(const at::Tensor& self, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(self.storage()),
                                                   self.key_set(), self.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  return at::Tensor(std::move(impl));
}

// the view, or an undefined tensor off the fast path; `args` the schema's arguments
at::Tensor view_geometry(int kind, c10::ArrayRef<c10::IValue> args) {
  if (args.empty() || !args[0].isTensor()) return at::Tensor();
  const at::Tensor& self = args[0].toTensor();
  // (sizes() would throw for symbolic sizes; a tracer's tensor takes the Python kernel)
  if (!self.defined() || !self.has_storage() || self.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
    return at::Tensor();
  if (kind == kView || kind == kReshapeAlias) {  // Meta's kernel, device-agnostic, over self's storage
    if (!args[1].isIntList() || (kind == kReshapeAlias && !args[2].isIntList())) return at::Tensor();
    try {
      if (kind == kView)
        return at::_ops::view::redispatch(c10::DispatchKeySet(c10::DispatchKey::Meta), self,
                                          c10::fromIntArrayRefSlow(args[1].toIntVector()));
      return at::_ops::_reshape_alias::redispatch(c10::DispatchKeySet(c10::DispatchKey::Meta), self,
                                                  c10::fromIntArrayRefSlow(args[1].toIntVector()),
                                                  c10::fromIntArrayRefSlow(args[2].toIntVector()));
    } catch (const c10::Error&) {
      return at::Tensor();
    }
  }
  if (kind == kAsStrided) {  // as_strided(self, size, stride, storage_offset=None)
    if (!args[1].isIntList() || !args[2].isIntList()) return at::Tensor();
    const auto size = args[1].toIntVector(), stride = args[2].toIntVector();
    int64_t off = self.storage_offset();
    if (size.size() != stride.size()) return at::Tensor();
    if (!args[3].isNone() && !view_int(args[3], off)) return at::Tensor();
    if (off < 0) return at::Tensor();
    // PyTorch's setStorage bound, against the bytes the table holds: a program reads a view
    // at a runtime offset, which XLA clamps into the buffer, so no view may reach past it
    bool empty = false;
    int64_t last = off;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] < 0 || stride[i] < 0) return at::Tensor();
      if (size[i] == 0) empty = true;
      else last += (size[i] - 1) * stride[i];
    }
    if (!empty) {
      const long long have = table_nbytes(self);
      if (have < 0 || (last + 1) * static_cast<long long>(self.dtype().itemsize()) > have) return at::Tensor();
    }
    return view_of(self, size, stride, off);
  }
  // the geometry views: the base's sizes and strides, changed
  const int64_t n = self.dim();
  c10::SmallVector<int64_t, 6> sh(self.sizes().begin(), self.sizes().end());
  c10::SmallVector<int64_t, 6> st(self.strides().begin(), self.strides().end());
  int64_t off = self.storage_offset();
  switch (kind) {
    case kSelect: {  // select.int(self, dim, index)
      int64_t dim, index;
      if (!view_int(args[1], dim) || !view_int(args[2], index)) return at::Tensor();
      const int64_t d = view_dim(dim, n);
      if (d < 0) return at::Tensor();
      const int64_t size = sh[d];
      if (index < -size || index >= size) return at::Tensor();
      if (index < 0) index += size;
      off += index * st[d];
      sh.erase(sh.begin() + d);
      st.erase(st.begin() + d);
      break;
    }
    case kSlice: {  // slice.Tensor(self, dim=0, start=None, end=None, step=1)
      int64_t dim, step;
      if (!view_int(args[1], dim) || !view_int(args[4], step) || step <= 0) return at::Tensor();
      const int64_t d = view_dim(dim, n);
      if (d < 0) return at::Tensor();
      const int64_t size = sh[d];
      int64_t start = 0, end = size;
      if (!args[2].isNone() && !view_int(args[2], start)) return at::Tensor();
      if (!args[3].isNone() && !view_int(args[3], end)) return at::Tensor();
      if (start < 0) start += size;
      if (end < 0) end += size;
      start = std::min(std::max(start, int64_t{0}), size);
      end = std::min(std::max(end, start), size);
      sh[d] = (end - start + step - 1) / step;
      off += start * st[d];
      st[d] *= step;
      break;
    }
    case kT: {  // t(self): a 0-d or 1-d tensor unchanged, a 2-d one transposed
      if (n > 2) return at::Tensor();
      if (n == 2) {
        std::swap(sh[0], sh[1]);
        std::swap(st[0], st[1]);
      }
      break;
    }
    case kTranspose: {  // transpose.int(self, dim0, dim1)
      int64_t a, b;
      if (!view_int(args[1], a) || !view_int(args[2], b)) return at::Tensor();
      const int64_t d0 = view_dim(a, n), d1 = view_dim(b, n);
      if (d0 < 0 || d1 < 0) return at::Tensor();
      std::swap(sh[d0], sh[d1]);
      std::swap(st[d0], st[d1]);
      break;
    }
    case kPermute: {  // permute(self, dims)
      if (!args[1].isIntList()) return at::Tensor();
      const auto dims = args[1].toIntVector();
      if (static_cast<int64_t>(dims.size()) != n) return at::Tensor();
      c10::SmallVector<int64_t, 6> nsh(n), nst(n);
      std::vector<bool> seen(n, false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t d = view_dim(dims[i], n);
        if (d < 0 || seen[d]) return at::Tensor();
        seen[d] = true;
        nsh[i] = sh[d];
        nst[i] = st[d];
      }
      sh = std::move(nsh);
      st = std::move(nst);
      break;
    }
    case kUnsqueeze: {  // unsqueeze(self, dim): PyTorch's inferUnsqueezeGeometry
      int64_t dim;
      if (!view_int(args[1], dim) || dim < -n - 1 || dim > n) return at::Tensor();
      const int64_t d = dim < 0 ? dim + n + 1 : dim;
      const int64_t stride = d < n ? sh[d] * st[d] : 1;
      sh.insert(sh.begin() + d, 1);
      st.insert(st.begin() + d, stride);
      break;
    }
    case kSqueezeDim: {  // squeeze.dim(self, dim): a size-1 dim dropped, any other kept
      int64_t dim;
      if (!view_int(args[1], dim)) return at::Tensor();
      const int64_t d = view_dim(dim, n);
      if (d < 0) return at::Tensor();
      if (sh[d] == 1) {
        sh.erase(sh.begin() + d);
        st.erase(st.begin() + d);
      }
      break;
    }
    case kExpand: {  // expand(self, size, *, implicit=False): PyTorch's inferExpandGeometry
      if (!args[1].isIntList()) return at::Tensor();
      const auto size = args[1].toIntVector();
      const int64_t k = static_cast<int64_t>(size.size());
      if (k < n) return at::Tensor();
      c10::SmallVector<int64_t, 6> osh(k), ost(k);
      // a new leading dim of size 1 gets the stride of what lies inside it (size * stride)
      int64_t inner_size = 1, inner_stride = 0;
      for (int64_t i = k - 1; i >= 0; --i) {
        int64_t s = size[i];
        const int64_t j = i - (k - n);
        const int64_t cur = j >= 0 ? sh[j] : 1;
        int64_t stride = j >= 0 ? st[j] : inner_size * inner_stride;
        if (s == -1) {
          if (j < 0) return at::Tensor();
          s = cur;
        }
        if (s < 0 || (s != cur && cur != 1)) return at::Tensor();
        if (s != cur) stride = 0;
        osh[i] = s;
        ost[i] = stride;
        inner_size = s;
        inner_stride = stride;
      }
      sh = std::move(osh);
      st = std::move(ost);
      break;
    }
    default:
      return at::Tensor();
  }
  return view_of(self, sh, st, off);
}

class ViewKernel final : public c10::OperatorKernel {
 public:
  ViewKernel(int kind, PyObject* python_kernel) : kind_(kind), python_(python_kernel) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    at::Tensor out = view_geometry(kind_, torch::jit::last(*stack, n));
    if (!out.defined()) {
      python_(op, ks, stack);  // off the fast path: the Python kernel, with its errors
      return;
    }
    torch::jit::drop(*stack, n);
    stack->emplace_back(std::move(out));
  }

 private:
  int kind_;
  BoxedKernel python_;
};

PyObject* register_view(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 3 || !PyUnicode_Check(a[0]) || !PyLong_Check(a[1]) || !PyCallable_Check(a[2])) {
    PyErr_SetString(PyExc_TypeError, "register_view(name, kind, python_kernel)");
    return nullptr;
  }
  const char* name = PyUnicode_AsUTF8(a[0]);
  if (!name) return nullptr;
  const long kind = PyLong_AsLong(a[1]);
  if (kind < 0 || kind >= kViewKinds) {
    PyErr_SetString(PyExc_ValueError, "register_view: unknown view kind");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  boxed_library()->impl(name, torch::CppFunction::makeFromBoxedFunctor(
                                  std::make_unique<ViewKernel>(static_cast<int>(kind), a[2])));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

}  // namespace
