// torch.empty(..., pin_memory=True) and every factory built on it (zeros, ones, full,
// rand, randn, torch.tensor, empty_like, ...) giving pinned CPU tensors, as on CUDA.
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
  }
  return PyModule_Create(&module_def);
}
