// The PrivateUse1 device guard, in C++ so that it never enters Python.
//
// The guard a Python backend can register (torch._C._acc.DeviceGuard) answers type() by
// calling a Python method. C++ calls the guard from destructors and noexcept paths: the
// autograd engine restores the stream of every backward node it ran through an
// InlineStreamGuard, and when a node's kernel raised a Python exception that guard's
// destructor runs while the exception is still set on the thread. Calling into Python then
// fails ("returned a result with an exception set"), the failure becomes a C++ exception
// inside a noexcept function, and the process aborts ("terminate called without an active
// exception") instead of the user seeing their error. torch.compile met this whenever a
// backward traced with fake tensors raised (kosmos-2: a data-dependent boolean index).
//
// The behaviour is the Python guard's: one device, index 0, whose only stream is the
// default one; events and stream queries are already complete. (The device's own
// Stream/Event semantics live in torchtpu/device/streams.py and events.py, which order
// work by computing pending values, not through this guard.) Loading this module registers
// the guard; device/lazy.py loads it before naming the device, so PyTorch's registration of
// the Python guard is then a no-op.
#include <Python.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static c10::Device device() { return c10::Device(kType, 0); }
  static c10::Stream stream() { return c10::Stream(c10::Stream::DEFAULT, device()); }

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return stream(); }
  c10::Stream getDefaultStream(c10::Device) const override { return stream(); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override { return stream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return stream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_device_guard", nullptr, -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__device_guard(void) {
  // Once per process (the registry keeps the first guard; PyTorch asks for it by type).
  if (!c10::impl::hasDeviceGuardImpl(kType)) {
    static TpuGuardImpl impl;
    c10::impl::registerDeviceGuard(kType, &impl);
  }
  return PyModule_Create(&module_def);
}
