// An op's Kernel (csrc/kernel.h) registered with PyTorch's dispatcher as a C++ boxed kernel for
// PrivateUse1, where torch.library would wrap it in PythonKernelHolder.
//
// Why: PythonKernelHolder turns the dispatcher's IValue stack into a Python tuple and dict,
// pybind11 then copies both into new ones to call the kernel through tp_call, and the result
// goes back through a schema-generic conversion; measured with perf on a strict 16x16 `a + b`
// (~9.5 us, of which PJRT's execute ~3 us), that wrapping was 8 % of the call, as much as
// fast()'s own key walk and lookup. Here the stack becomes the same (args, kwargs) the holder
// would pass (PyTorch's parseIValuesToPyArgsKwargs: positional arguments up to the last one that
// differs from its default, keyword-only ones by name where not default; dtypes, layouts and
// memory formats as their torch objects, a wrapped number as a Python number), read off the
// schema once per op, and the kernel is called directly.
//
// Semantics kept from the holder: the GIL taken for the call; a Python exception raised through
// the dispatcher as python_error (persisted: the autograd engine may carry it to another thread);
// the results checked against the schema's returns. Not kept: the holder's hand-off to another
// Python interpreter (torch::deploy) under a dispatch mode or for a Python-key tensor: this
// process has one interpreter, where the hand-off calls the same kernel.
//
// register_kernel(name, kernel): `name` an aten overload ("add.Tensor"), `kernel` a Kernel.
#pragma once

// (included inside hit.cpp's anonymous namespace, after kernel.h; its headers are included at
// hit.cpp's top: the dispatcher's, torch::Library, toIValue/toPyObject, memory formats)
namespace {

class BoxedKernel final : public c10::OperatorKernel {
 public:
  // the kernel is kept for the life of the process (never decref'd: the dispatcher's tables
  // outlive the interpreter at exit)
  explicit BoxedKernel(PyObject* kernel) : kernel_(kernel) { Py_INCREF(kernel); }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t n = schema.arguments().size();
    auto arguments = torch::jit::pop(*stack, n);
    pybind11::gil_scoped_acquire gil;
    if (kinds_.size() != n) learn(schema);
    PyObject* out = call(schema, arguments);
    if (!out) {
      python_error err;
      err.persist();
      throw err;
    }
    push(op, schema, stack, out);
  }

 private:
  enum Kind : char { kAny, kDtype, kLayout, kMemoryFormat };

  // per argument, how its IValue becomes a Python object, and where keyword-only ones start
  void learn(const c10::FunctionSchema& schema) {
    const auto& args = schema.arguments();
    std::vector<char> kinds(args.size(), kAny);
    for (size_t i = 0; i < args.size(); ++i) {
      c10::TypePtr t = args[i].real_type();
      if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
      if (t->kind() == c10::ScalarTypeType::Kind) kinds[i] = kDtype;
      else if (t->kind() == c10::LayoutType::Kind) kinds[i] = kLayout;
      else if (t->kind() == c10::MemoryFormatType::Kind) kinds[i] = kMemoryFormat;
    }
    size_t kw = args.size();
    while (kw > 0 && args[kw - 1].kwarg_only()) --kw;
    kwarg_only_start_ = kw;
    kinds_ = std::move(kinds);
  }

  static bool is_default(const c10::Argument& arg, const c10::IValue& v) {
    return arg.default_value().has_value() && *arg.default_value() == v;
  }

  // a new reference, or nullptr with a Python error set
  PyObject* convert(size_t i, const c10::IValue& v) const {
    if (v.isNone()) Py_RETURN_NONE;
    try {
      switch (kinds_[i]) {
        case kDtype: {
          PyObject* o = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt())));
          Py_INCREF(o);
          return o;
        }
        case kLayout: {
          PyObject* o = reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt())));
          Py_INCREF(o);
          return o;
        }
        case kMemoryFormat: {
          PyObject* o = torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt()));
          Py_INCREF(o);
          return o;
        }
        default:
          break;
      }
      if (v.isTensor()) {  // the common case without toPyObject's generic walk
        const at::Tensor& t = v.toTensor();
        if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number())
          return THPVariable_Wrap(t);
      }
      return torch::jit::toPyObject(v).release().ptr();
    } catch (pybind11::error_already_set& e) {
      e.restore();
      return nullptr;
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return nullptr;
    }
  }

  PyObject* call(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& arguments) const {
    const auto& specs = schema.arguments();
    size_t npos = kwarg_only_start_;
    while (npos > 0 && is_default(specs[npos - 1], arguments[npos - 1])) --npos;
    PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(npos));
    PyObject* kwargs = args ? PyDict_New() : nullptr;
    if (!kwargs) {
      Py_XDECREF(args);
      return nullptr;
    }
    PyObject* out = nullptr;
    for (size_t i = 0; i < npos; ++i) {
      PyObject* o = convert(i, arguments[i]);
      if (!o) goto done;
      PyTuple_SET_ITEM(args, static_cast<Py_ssize_t>(i), o);
    }
    for (size_t i = kwarg_only_start_; i < arguments.size(); ++i) {
      if (is_default(specs[i], arguments[i])) continue;
      PyObject* o = convert(i, arguments[i]);
      if (!o) goto done;
      const int rc = PyDict_SetItemString(kwargs, specs[i].name().c_str(), o);
      Py_DECREF(o);
      if (rc < 0) goto done;
    }
    // a Kernel through its fast call; any other callable (a view's Python kernel: views.h) plainly
    out = Py_TYPE(kernel_) == &KernelType ? kernel_call(kernel_, args, kwargs) : PyObject_Call(kernel_, args, kwargs);
  done:
    Py_DECREF(args);
    Py_DECREF(kwargs);
    return out;
  }

  // the kernel's result onto the stack as the schema's returns (PyTorch's pushPyOutToStack);
  // steals `out`
  static void push(const c10::OperatorHandle& op, const c10::FunctionSchema& schema, torch::jit::Stack* stack,
                   PyObject* out) {
    pybind11::object result = pybind11::reinterpret_steal<pybind11::object>(out);
    const auto& returns = schema.returns();
    if (returns.empty()) {
      TORCH_CHECK(out == Py_None, "Expected the tpu kernel for ", op.operator_name(),
                  " to return None but it returned something else instead.");
      return;
    }
    if (returns.size() == 1) {
      stack->emplace_back(one(out, returns[0]));
      return;
    }
    pybind11::sequence outs = pybind11::cast<pybind11::sequence>(result);
    for (size_t i = 0; i < outs.size(); ++i) stack->emplace_back(one(outs[i].ptr(), returns[i]));
  }

  static c10::IValue one(PyObject* obj, const c10::Argument& ret) {
    if (THPVariable_Check(obj) && ret.real_type()->kind() == c10::TensorType::Kind)
      return c10::IValue(THPVariable_Unpack(obj));
    return torch::jit::toIValue(obj, ret.real_type());
  }

  PyObject* kernel_;
  std::vector<char> kinds_;
  size_t kwarg_only_start_ = 0;
};

// one IMPL library for aten at PrivateUse1, kept for the life of the process (its
// registrations end with it)
torch::Library* boxed_library() {
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return lib;
}

PyObject* register_kernel(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 2 || !PyUnicode_Check(a[0]) || Py_TYPE(a[1]) != &KernelType) {
    PyErr_SetString(PyExc_TypeError, "register_kernel(name, kernel): an aten overload's name and a Kernel");
    return nullptr;
  }
  const char* name = PyUnicode_AsUTF8(a[0]);
  if (!name) return nullptr;
  HANDLE_TH_ERRORS
  boxed_library()->impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<BoxedKernel>(a[1])));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

}  // namespace
