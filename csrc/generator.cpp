// torch.Generator(device="tpu"): the one piece of torchtpu that must be C++.
//
// PyTorch's Generator constructor asks the PrivateUse1 hooks for a new generator, and
// the hooks a Python backend can register (is_available / has_primary_context /
// is_built) cannot provide one; the hooks fall back to a generator factory registered
// with REGISTER_GENERATOR_PRIVATEUSE1. This file is that factory and the generator it
// makes. The generator only holds state (a seed and an offset); the random ops
// (torchtpu/ops/random.py through torchtpu/runtime/rng.py) read and advance it from
// Python, one offset per op, and derive their JAX key inside the compiled program.
//
// The state tensor is 16 bytes: seed then offset, each a little-endian uint64, the same
// layout torch.tpu.get_rng_state() has always returned.
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstring>

namespace {

constexpr int64_t kStateBytes = 2 * sizeof(uint64_t);

struct TpuGeneratorImpl : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(
            c10::Device(c10::DeviceType::PrivateUse1, index),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;  // a new seed starts a new stream, as torch.manual_seed does on CUDA
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({kStateBytes}, c10::ScalarType::Byte,
                                       /*pin_memory=*/false, std::nullopt);
    uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.mutable_data_ptr(), words, kStateBytes);
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.layout() == c10::kStrided && state.device().is_cpu() &&
                         state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                     "RNG state must be a torch.ByteTensor");
    TORCH_CHECK(state.numel() == kStateBytes && state.is_contiguous(),
                "RNG state is wrong size: expected ", kStateBytes, " bytes, got ",
                state.numel());
    uint64_t words[2];
    std::memcpy(words, state.data(), kStateBytes);
    seed_ = words[0];
    offset_ = words[1];
  }

 private:
  TpuGeneratorImpl* clone_impl() const override {
    auto* copy = new TpuGeneratorImpl(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

at::Generator make_tpu_generator(c10::DeviceIndex index) {
  return at::make_generator<TpuGeneratorImpl>(index < 0 ? 0 : index);
}

PyModuleDef generator_module = {PyModuleDef_HEAD_INIT, "_generator", nullptr, -1, nullptr};

}  // namespace

// Importing the module registers the factory; it has no Python functions. The slot is
// set directly rather than through REGISTER_GENERATOR_PRIVATEUSE1, whose constructor
// prints a deprecation notice on every import (the replacement it names, a C++
// PrivateUse1HooksInterface, would displace the Python hooks torchtpu registers).
PyMODINIT_FUNC PyInit__generator(void) {
  auto& slot = at::GetGeneratorPrivate();
  if (!slot.has_value()) {
    slot = make_tpu_generator;
  }
  return PyModule_Create(&generator_module);
}
