"""The "tpu" device as `import torch` leaves it under autoload: named, with no JAX loaded.

PyTorch's autoload (the `torch.backends` entry point, `torchtpu_autoload.py`) runs at the
end of every `import torch`, so what it does is a cost to every PyTorch program on the
machine, most of which never touch "tpu". Importing torchtpu there meant importing JAX
(about 5 s on a loaded 2-core machine: autoload made `import torch` 1.7x as slow). This
module does at that moment only what needs neither JAX nor the rest of torchtpu, and
makes every first touch of the device load torchtpu and then proceed as if it had been
loaded all along:

- PrivateUse1 is named "tpu" with its hooks and device guard (so `torch.device("tpu")`,
  `t.is_tpu` and `torch.accelerator.current_accelerator()` work at once), and
  `torch.tpu` is a module that loads torchtpu on its first attribute (`_is_in_bad_fork`
  and `manual_seed_all` excepted: `torch.manual_seed` asks for them in every program, so
  the seed is kept and given to the device generator when torchtpu loads);
- a PrivateUse1 fallback kernel (the first op on the device is always one: no tpu tensor
  exists before it) and a CPU `_pin_memory` kernel load torchtpu, step aside, and
  re-dispatch the same call to the kernels torchtpu has just registered;
- the C++ extensions (torch.Generator(device="tpu"), pinned factories), `module.to("tpu")`
  keeping its Parameter objects (device/shallow_copy.py), torch.accelerator's routing and Accelerate's default device
  are installed as they are (none needs JAX); torch.Event/torch.Stream, tpu storages,
  `torch.from_dlpack` (once JAX is imported) and the c10d backend "tpu" load torchtpu
  when first used on the device.

`import torchtpu` (explicit, or from any of the above) calls `retire()`: the lazy kernels
and wrappers go and `torch.tpu` becomes the real module. Only the standard library and
torch are imported here: the entry point loads this file without running torchtpu's
`__init__`, and its siblings (`_leaf`) the same way.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
import warnings

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_HERE)

_libs: list[torch.library.Library] = []   # lazy kernels, dropped by retire()
_patches: list[tuple[object, str, object]] = []   # (owner, name, original or _ABSENT), put back by retire()
_ABSENT = object()
_seed: list[int] = []    # torch.manual_seed's seed, kept for the device generator until torchtpu loads
_real: list[types.ModuleType] = []   # the real torch.tpu once torchtpu has loaded
_lock = threading.Lock()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    """Only where csrc/device_guard.cpp is not built: this guard calls Python for type()."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def name_device(device_module: types.ModuleType) -> bool:
    """Rename PrivateUse1 to "tpu" and register hooks, device guard and `torch.tpu`
    (PyTorch allows each once per process). False when already done."""
    if torch._C._get_privateuse1_backend_name() == "tpu":
        return False
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    try:  # the C++ guard first (csrc/device_guard.cpp says why); PyTorch then keeps it
        _leaf("runtime._device_guard")
    except ImportError:  # not built: the Python guard serves, except on a backward that raises
        pass

    _setup_privateuseone_for_python_backend("tpu", backend_module=device_module, hook=_Hooks(),
                                            device_guard=_Guard())
    return True


def load_torchtpu() -> types.ModuleType:
    """Import torchtpu (its registration calls retire()); the real torch.tpu."""
    importlib.import_module("torchtpu")
    if not _real:  # torchtpu is mid-import on this thread and has not registered yet
        raise RuntimeError("torchtpu: the tpu device was used while torchtpu was still being imported")
    return _real[0]


class _LazyTpuModule(types.ModuleType):
    """torch.tpu before torchtpu loads: any attribute loads it and is read from the real one."""

    # a package to the import system, so `import torch.tpu.amp` asks the finders (below)
    # instead of failing with "'torch.tpu' is not a package"
    __path__: list = []

    def __getattr__(self, name: str):
        if name.startswith("__"):  # import machinery, pickle, inspect: not a use of the device
            raise AttributeError(name)
        return getattr(load_torchtpu(), name)


class _Registered(importlib.abc.Loader):
    """A loader handing out a module already in sys.modules."""

    def __init__(self, module: types.ModuleType):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        pass


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """`import torch.tpu.amp` (.memory, .random, .streams) before torchtpu loads: loads it;
    the real torch.tpu registers its submodules in sys.modules (device/submodules.py)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("torch.tpu.") or fullname.count(".") != 2:
            return None
        load_torchtpu()
        module = sys.modules.get(fullname)
        return None if module is None else importlib.util.spec_from_loader(fullname, _Registered(module))


_finder = _SubmoduleFinder()


def _is_in_bad_fork() -> bool:
    return _real[0]._is_in_bad_fork() if _real else False


def _manual_seed_all(seed: int) -> None:
    if _real:
        _real[0].manual_seed_all(seed)
    else:  # nothing can draw from the device generator before torchtpu loads
        _seed[:] = [int(seed)]


def _leaf(name: str) -> types.ModuleType:
    """torchtpu.<name> (a module importing only the standard library and torch, or a C++
    extension), loaded from its file without importing its packages (torchtpu's __init__
    imports JAX); a later `import torchtpu` finds it in sys.modules and uses the same one."""
    qualname = f"torchtpu.{name}"
    if qualname in sys.modules:
        return sys.modules[qualname]
    base = os.path.join(_PACKAGE_DIR, *name.split("."))
    paths = [base + ".py"] + [base + s for s in importlib.machinery.EXTENSION_SUFFIXES]
    path = next((p for p in paths if os.path.exists(p)), None)
    if path is None:
        raise ImportError(f"no module named {qualname!r} under {_PACKAGE_DIR}", name=qualname)
    spec = importlib.util.spec_from_file_location(qualname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualname] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[qualname]
        raise
    return module


def _patch(owner, name: str, value) -> None:
    _patches.append((owner, name, owner.__dict__.get(name, _ABSENT) if isinstance(owner, type)
                     else getattr(owner, name)))
    setattr(owner, name, value)


def _names_tpu(device) -> bool:
    """Whether a constructor's `device` argument is the tpu device (None and an index mean
    the current accelerator, which is tpu once the device is named)."""
    if device is None or isinstance(device, int):
        return True
    try:
        return torch.device(device).type == "tpu"
    except (RuntimeError, TypeError):
        return False


def _first_op(keyset, op, *args, **kwargs):
    """PrivateUse1 fallback until torchtpu loads: load it, then dispatch the call again to
    the kernels it registered (this fallback is gone by then)."""
    load_torchtpu()
    return op.redispatch(keyset, *args, **kwargs)


def _first_pin(keyset, *args, **kwargs):
    """CPU _pin_memory until torchtpu loads (PyTorch's needs C++ hooks a Python backend lacks)."""
    load_torchtpu()
    return torch.ops.aten._pin_memory.default.redispatch(keyset, *args, **kwargs)


def _placeholder(name: str) -> type:
    """A stand-in for torch.Event / torch.Stream: on tpu it loads torchtpu and builds the type
    torchtpu installs under that name; elsewhere PyTorch's own type."""
    original = getattr(torch, name)
    Replacing = _leaf("device.replacing").Replacing

    class Loading(Replacing):
        def __call__(cls, *args, **kwargs):
            if "device_type" in kwargs or _names_tpu(kwargs.get("device", args[0] if args else None)):
                load_torchtpu()
                target = getattr(torch, name)
                if target is not placeholder:
                    return target(*args, **kwargs)
            return original(*args, **kwargs)

    placeholder = Loading(name, (original,), {"_stands_for": original, "__module__": "torch",
                                              "__doc__": original.__doc__})
    return placeholder


def _storage_new(original):
    def __new__(cls, *args, device=None, **kwargs):
        if device is not None and _names_tpu(device):
            load_torchtpu()
            return cls.__new__(cls, *args, device=device, **kwargs)  # torchtpu's, installed by now
        if device is not None:
            kwargs["device"] = device
        return original(cls, *args, **kwargs)

    return staticmethod(__new__)


def _from_dlpack(original):
    def from_dlpack(ext_tensor, *args, **kwargs):
        device = kwargs.get("device")
        # torchtpu routes JAX arrays and device="tpu" to tpu tensors (kernels/interop.py)
        if not _real and ("jax" in sys.modules or (device is not None and _names_tpu(device))):
            load_torchtpu()
            return torch.from_dlpack(ext_tensor, *args, **kwargs)
        return original(ext_tensor, *args, **kwargs)

    return from_dlpack


def _to_dlpack(original):
    def to_dlpack(tensor):
        # a tpu tensor exists: torchtpu has loaded, and Tensor.__dlpack__ exports its JAX buffer
        # (kernels/interop.py); PyTorch's C++ exporter would give a capsule with no data
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            return tensor.__dlpack__()
        return original(tensor)

    return to_dlpack


def _create_process_group(backend_opts, pg_options):
    load_torchtpu()
    from torchtpu.distributed import backend

    return backend.create(backend_opts, pg_options)


def bind() -> None:
    """What autoload does: everything above, no JAX. Once per process; nothing if torchtpu
    has already loaded."""
    with _lock:
        if _real or _libs:
            return
        module = _LazyTpuModule("torch.tpu", "torch.tpu until torchtpu loads (torchtpu.device.lazy)")
        if _finder not in sys.meta_path:
            sys.meta_path.append(_finder)
        module._is_in_bad_fork = _is_in_bad_fork
        module.manual_seed_all = _manual_seed_all
        if not name_device(module):
            return
        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(_first_op, "PrivateUse1", with_keyset=True)
        pin = torch.library.Library("aten", "IMPL")
        pin.impl("_pin_memory", _first_pin, "CPU", with_keyset=True)
        _libs.extend([fallback, pin])
        for extension in ("runtime._generator", "device._pinned_factories"):
            try:
                _leaf(extension)
            except ImportError:  # not built: torchtpu names the fix when the device is used
                pass
        warnings.filterwarnings("ignore", message=r"GetGeneratorForPrivateuse1\(\) is deprecated")
        for leaf in ("device.shallow_copy", "device.accelerator", "device.accelerate_support", "device.torchao_support"):
            _leaf(leaf).install()
        if not hasattr(torch.storage._StorageBase, "tpu"):
            from torch.utils.backend_registration import _generate_storage_methods_for_privateuse1_backend

            _generate_storage_methods_for_privateuse1_backend("tpu")
        _patch(torch, "Event", _placeholder("Event"))
        _patch(torch, "Stream", _placeholder("Stream"))
        _patch(torch.UntypedStorage, "__new__", _storage_new(torch.UntypedStorage.__new__))
        dlpack = _from_dlpack(torch.utils.dlpack.from_dlpack)
        _patch(torch, "from_dlpack", dlpack)
        _patch(torch.utils.dlpack, "from_dlpack", dlpack)
        _patch(torch.utils.dlpack, "to_dlpack", _to_dlpack(torch.utils.dlpack.to_dlpack))
        import torch.distributed as dist

        if dist.is_available() and "tpu" not in dist.Backend.backend_list:
            dist.Backend.register_backend("tpu", _create_process_group, extended_api=True, devices=["tpu"])


def retire(real_module: types.ModuleType) -> None:
    """torchtpu is loading: drop the lazy kernels and wrappers, make `real_module` torch.tpu,
    and give it the seed torch.manual_seed set before."""
    with _lock:
        for lib in _libs:
            lib._destroy()
        _libs.clear()
        for owner, name, original in reversed(_patches):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _patches.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        if getattr(torch, "tpu", None) is not real_module:
            torch.tpu = real_module
        sys.modules["torch.tpu"] = real_module
        _real[:] = [real_module]
    if _seed:
        real_module.manual_seed_all(_seed.pop())
