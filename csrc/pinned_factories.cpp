// torch.empty(..., pin_memory=True) and every factory built on it (zeros, ones, full,
// rand, randn, torch.tensor, empty_like, ...), and arange, eye, the windows, tril/triu
// indices, scalar_tensor and fftfreq, giving pinned CPU tensors, as on CUDA.
//
// A CPU allocation with pin_memory=True asks the accelerator's C++ hooks for a pinned
// allocator (getPinnedMemoryAllocator); the hooks a Python backend can register have
// none, so PyTorch raises. Every such factory allocates through aten::empty.memory_format
// or aten::empty_strided, whose BackendSelect kernels pick the backend from the
// options. This file replaces those two BackendSelect kernels with ones that do exactly
// what PyTorch's generated ones do (compute the key, redispatch), except for a CPU
// allocation with pin_memory=True: that one is allocated plainly and handed to
// aten::_pin_memory, which torchtpu serves at the CPU key from its pinned block table
// (torchtpu/device/host_memory.py, torchtpu/runtime/pinned.py).
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_pin_memory_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/empty_strided_ops.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <memory>

namespace {

// The pinned path: a plain CPU allocation then _pin_memory (a copy; pinning keeps a
// dense tensor's strides, so the memory format survives).
bool pinned_on_cpu(std::optional<bool> pin_memory, c10::DispatchKeySet keys) {
  return pin_memory.value_or(false) && keys.highestPriorityTypeId() == c10::DispatchKey::CPU;
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::DispatchKeySet keys(c10::computeDispatchKey(dtype, layout, device));
  if (!pinned_on_cpu(pin_memory, keys)) {
    return at::_ops::empty_memory_format::redispatch(keys, size, dtype, layout, device, pin_memory,
                                                     memory_format);
  }
  auto host = at::_ops::empty_memory_format::redispatch(keys, size, dtype, layout, device,
                                                        std::nullopt, memory_format);
  return at::_ops::_pin_memory::call(host, std::nullopt);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  c10::DispatchKeySet keys(c10::computeDispatchKey(dtype, layout, device));
  if (!pinned_on_cpu(pin_memory, keys)) {
    return at::_ops::empty_strided::redispatch(keys, size, stride, dtype, layout, device, pin_memory);
  }
  auto host = at::_ops::empty_strided::redispatch(keys, size, stride, dtype, layout, device, std::nullopt);
  return at::_ops::_pin_memory::call(host, std::nullopt);
}

// The factories that do not end in one of the two allocations above: arange, eye and the
// window functions resize the empty tensor they start from (a pinned block's storage is not
// resizable), tril_indices, triu_indices and scalar_tensor allocate through the pinned
// allocator themselves. For a pinned CPU result they run unpinned, then _pin_memory copies
// the result into a pinned block; otherwise they redispatch exactly as PyTorch's generated
// BackendSelect kernel does. One boxed kernel serves them all: the options are found in
// the stack by name.
void pinned_after(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t base = stack->size() - schema.arguments().size();
  auto arg = [&](const char* name) -> c10::IValue& {
    return (*stack)[base + schema.argumentIndexWithName(name).value()];
  };
  auto dtype = arg("dtype").toOptional<at::ScalarType>();
  auto layout = arg("layout").toOptional<at::Layout>();
  auto device = arg("device").toOptional<at::Device>();
  auto pin_memory = arg("pin_memory").toOptional<bool>();
  c10::DispatchKeySet keys(c10::computeDispatchKey(dtype, layout, device));
  if (!pinned_on_cpu(pin_memory, keys)) {
    op.redispatchBoxed(keys, stack);
    return;
  }
  arg("pin_memory") = c10::IValue();
  op.redispatchBoxed(keys, stack);
  auto host = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, at::_ops::_pin_memory::call(host, std::nullopt));
}

const char* const kPinnedAfter[] = {
    "arange", "arange.start", "arange.start_step", "range", "range.step", "eye", "eye.m",
    "hann_window", "hann_window.periodic", "hamming_window", "hamming_window.periodic",
    "hamming_window.periodic_alpha", "hamming_window.periodic_alpha_beta", "bartlett_window",
    "bartlett_window.periodic", "blackman_window", "blackman_window.periodic", "kaiser_window",
    "kaiser_window.periodic", "kaiser_window.beta", "tril_indices", "triu_indices", "scalar_tensor",
    "fft_fftfreq", "fft_rfftfreq",
};

// Replacing PyTorch's own BackendSelect kernels is deliberate: the dispatcher's
// "Overriding a previously registered kernel" notice is silenced for these two only.
struct Silent : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

std::unique_ptr<torch::Library> library;

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_pinned_factories", nullptr, -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__pinned_factories(void) {
  if (!library) {
    Silent silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                               c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
    library->impl("empty.memory_format", TORCH_FN(empty_memory_format));
    library->impl("empty_strided", TORCH_FN(empty_strided));
    for (const char* name : kPinnedAfter) {
      library->impl(name, torch::CppFunction::makeFromBoxedFunction<&pinned_after>());
    }
  }
  return PyModule_Create(&module_def);
}
