"""Hugging Face Accelerate (and the Transformers code that sizes memory) on "tpu", as on cuda.

Accelerate and Transformers name the devices they know in fixed lists and branches, and
a PrivateUse1 device is in none of them. Each gap below is mended where it lives, when
the module that holds it is imported (a meta-path hook waits for it: nothing is imported
before the user imports accelerate or transformers), and only where Accelerate or
Transformers would otherwise fall back to the CPU or to cuda while torch's current
accelerator is tpu. `cpu=True` and every device they know keep their meaning.

- `accelerate.state.PartialState.default_device` (MPS, MLU, SDAA, MUSA, NPU, HPU, CUDA,
  XPU, Neuron, else CPU): a Trainer on tpu had its model moved back to the CPU by
  `accelerator.prepare` and its batches left there, while Transformers (which asks
  torch.accelerator) said tpu. Its only outside knob, ACCELERATE_TORCH_DEVICE, overrides
  even `cpu=True`. Where it would say CPU, it says tpu.
- `accelerate.accelerator.Accelerator.__init__`: fp16 mixed precision (`Accelerator(
  mixed_precision="fp16")`, `TrainingArguments(fp16=True)`) is allowed only on the devices
  of a tuple written in the function (xpu, cuda, npu, xla, mlu, musa, hpu, sdaa, mps); no
  argument or setting reaches it, so that one constant of the function's code gains "tpu".
  The rest of the fp16 path is Accelerate's own: `torch.autocast(device_type="tpu",
  dtype=torch.float16)` around the model's forward, and a GradScaler.
- `accelerate.utils.modeling.get_grad_scaler` picks the GradScaler by which devices are
  available and ends in `GradScaler("cuda")`, which disables itself on a machine with no
  CUDA (no loss scaling at all): on tpu it returns `torch.amp.GradScaler("tpu")`
  (`ShardedGradScaler(device="tpu")` for FSDP).
- `accelerate.utils.modeling.get_max_memory`, which `device_map="auto"` / `"balanced"` (and
  `transformers serve`'s default `--device auto`) plans with, lists cuda's devices and the
  CPU: on tpu it lists tpu's devices by index (an index is torch's current accelerator) with
  their free memory, first, so the model goes to tpu:0..N-1 as it goes to cuda's; a given
  `max_memory`'s indices are checked against tpu's device count, not cuda's.
- `accelerate.utils.dataclasses.DynamoBackend`, the enum every `dynamo_backend` /
  `TrainingArguments(torch_compile_backend=...)` name is checked against: it gains TPU,
  so `"tpu"` reaches `torch.compile(model, backend="tpu")` ('TPU' is not a valid
  DynamoBackend before).
- `transformers.generation.continuous_batching.utils.get_device_and_memory_breakdown`
  (cuda, xpu, mps, else the host's RAM): continuous batching sized its KV cache from the
  host's memory on tpu. It reads `torch.tpu.mem_get_info()` and `memory_reserved()` as it
  reads cuda's.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch


def _tpu_is_the_accelerator() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "tpu"


def _marked(fn):
    fn._torchtpu = True
    return fn


def _rebind(orig, new) -> None:
    """Every name an already imported Accelerate or Transformers module holds for `orig` (under any alias) now
    names `new`; modules importing it later get `new` from the module that was mended."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(("accelerate", "transformers")):
            continue
        for attr, value in list(getattr(mod, "__dict__", {}).items()):
            if value is orig:
                setattr(mod, attr, new)


def _patch_default_device(state) -> None:
    cls = state.PartialState
    orig = cls.__dict__.get("default_device")
    if not isinstance(orig, property) or getattr(orig.fget, "_torchtpu", False):
        return

    @_marked
    def default_device(self) -> torch.device:
        dev = orig.fget(self)
        if dev.type == "cpu" and _tpu_is_the_accelerator():
            return torch.device("tpu")
        return dev

    default_device.__doc__ = orig.__doc__
    cls.default_device = property(default_device)


def _fp16_devices(code):
    """Index of the tuple of device names fp16 is allowed on, among `code`'s constants."""
    hits = [i for i, c in enumerate(code.co_consts)
            if isinstance(c, tuple) and c and all(isinstance(x, str) for x in c) and {"cuda", "xpu", "mps"} <= set(c)]
    return hits[0] if len(hits) == 1 else None


def _patch_fp16_allow_list(accelerator) -> None:
    init = accelerator.Accelerator.__init__
    code = getattr(init, "__code__", None)
    i = None if code is None else _fp16_devices(code)
    if i is None or "tpu" in code.co_consts[i]:
        return  # mended already, or an Accelerate without that tuple (tests/test_stacks_hf.py's fp16 tests fail)
    consts = list(code.co_consts)
    consts[i] = consts[i] + ("tpu",)
    init.__code__ = code.replace(co_consts=tuple(consts))


def _patch_accelerator(accelerator) -> None:
    _patch_fp16_allow_list(accelerator)


def _patch_grad_scaler(modeling) -> None:
    orig = modeling.get_grad_scaler
    if getattr(orig, "_torchtpu", False):
        return

    @_marked
    def get_grad_scaler(distributed_type=None, **kwargs):
        if not _tpu_is_the_accelerator():
            return orig(distributed_type, **kwargs)
        if distributed_type is not None and getattr(distributed_type, "value", distributed_type) == "FSDP":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(device="tpu", **kwargs)
        return torch.amp.GradScaler("tpu", **kwargs)

    get_grad_scaler.__doc__ = orig.__doc__
    get_grad_scaler.__wrapped__ = orig
    _rebind(orig, get_grad_scaler)  # accelerate imported before torchtpu


def _patch_max_memory(modeling) -> None:
    orig = modeling.get_max_memory
    if getattr(orig, "_torchtpu", False):
        return

    @_marked
    def get_max_memory(max_memory=None):
        if max_memory is not None and _tpu_is_the_accelerator():
            # its check of the indices counts cuda's devices: tpu's are counted here instead
            with _quiet(modeling.logger, "is not available, available devices are"):
                found = orig(max_memory)
            n = torch.tpu.device_count()
            for k in found:
                if isinstance(k, int) and not 0 <= k < n:
                    modeling.logger.warning(f"Device {k} is not available, available devices are {list(range(n))}")
            return found
        found = orig(max_memory)
        if max_memory is not None or not _tpu_is_the_accelerator() or any(isinstance(k, int) for k in found):
            return found
        # as its cuda branch: each device's free memory under its index (an index is torch's current
        # accelerator, tpu), devices before "cpu" so that device_map="auto" fills them first
        devices = {i: torch.tpu.mem_get_info(i)[0] for i in range(torch.tpu.device_count())}
        return {**devices, **found}

    get_max_memory.__doc__ = orig.__doc__
    get_max_memory.__wrapped__ = orig
    _rebind(orig, get_max_memory)


class _quiet:
    """Drop `logger`'s records containing `text` for the duration of a with block."""

    def __init__(self, logger, text: str):
        self.logger, self.text = logger, text

    def filter(self, record) -> bool:
        return self.text not in record.getMessage()

    def __enter__(self):
        self.logger.addFilter(self)

    def __exit__(self, *exc):
        self.logger.removeFilter(self)
        return False


def _patch_modeling(modeling) -> None:
    _patch_grad_scaler(modeling)
    _patch_max_memory(modeling)


def _patch_dynamo_backend(dataclasses) -> None:
    cls = dataclasses.DynamoBackend
    if "TPU" in cls.__members__:
        return
    # Enum has no public way to add a member; this is what EnumType.__new__ does for each
    member = str.__new__(cls, "TPU")
    member._name_ = member._value_ = "TPU"
    member.__objclass__ = cls
    member._sort_order_ = len(cls._member_names_)
    cls._member_names_.append("TPU")
    cls._member_map_["TPU"] = member
    cls._value2member_map_["TPU"] = member
    type.__setattr__(cls, "TPU", member)


def _patch_cb_memory(utils) -> None:
    orig = utils.get_device_and_memory_breakdown
    if getattr(orig, "_torchtpu", False):
        return

    @_marked
    def get_device_and_memory_breakdown():
        found = orig()
        if found[0].type != "cpu" or not _tpu_is_the_accelerator():
            return found
        # as its cuda branch: what the device has free, not the device's size
        torch.tpu.empty_cache()
        torch.tpu.synchronize()
        free, total = torch.tpu.mem_get_info()
        return torch.device("tpu"), total, torch.tpu.memory_reserved(), total - free

    get_device_and_memory_breakdown.__doc__ = orig.__doc__
    get_device_and_memory_breakdown.__wrapped__ = orig
    _rebind(orig, get_device_and_memory_breakdown)


# module -> what is mended when it has been executed; modules importing a patched name
# later (`from .modeling import get_grad_scaler`) get the mended one
_PATCHES = {
    "accelerate.state": _patch_default_device,
    "accelerate.utils.dataclasses": _patch_dynamo_backend,
    "accelerate.utils.modeling": _patch_modeling,
    "accelerate.accelerator": _patch_accelerator,
    "transformers.generation.continuous_batching.utils": _patch_cb_memory,
}


# Modules found still executing when install() ran: `import accelerate` before torch runs
# accelerate/accelerator.py down to its `import torch`, whose autoload installs this, before
# `Accelerator` exists. Each is mended at the next import of any module after it finished.
_pending: set[str] = set()


def _initializing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _patch_loaded(name: str) -> None:
    module = sys.modules.get(name)
    if module is None:
        _pending.discard(name)  # its import failed; the finder sees it again if it is retried
    elif _initializing(module):
        _pending.add(name)
    else:
        _pending.discard(name)
        _PATCHES[name](module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for waiting in list(_pending):
            _patch_loaded(waiting)
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)  # the real spec, found by the other finders
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    for name in _PATCHES:
        if name in sys.modules:
            _patch_loaded(name)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
