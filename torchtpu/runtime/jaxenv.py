"""The one place that configures JAX and maps dtypes between torch and JAX.

JAX is an implementation detail: nothing outside torchtpu sees a jax.Array.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_ENABLE_X64", "1")  # PyTorch's int64/float64 must stay 64-bit

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

jax.config.update("jax_enable_x64", True)


def _tracebacks() -> None:
    """JAX records the caller's Python stack at every executable launch (jaxlib's user context)
    and every traced primitive (source info for MLIR locations and tracing errors). torchtpu
    never shows either: its errors are raised from the user's own torch call. The record walks
    the whole stack, materializing a frame object per level, so its cost grows with the depth
    the op is called from: ~0.3 us of a strict 16x16 add from a shallow loop, 1.5-3 us inside
    a torch.compile'd call or a model's forward. TORCHTPU_JAX_TRACEBACKS=1 keeps them."""
    from jax._src.lib import _jax

    from .. import config

    if not config.read("jax_tracebacks") and hasattr(_jax, "set_tracebacks_enabled"):
        _jax.set_tracebacks_enabled(False)


_tracebacks()

from . import chips  # noqa: E402

chips.configure(jax.config)  # one chip per process under torchrun on a TPU or GPU host

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    # float8: XLA's own element types (ml_dtypes); casts into them saturate or not as CPU's do
    # (ops/low_precision.py), not as XLA's plain convert does
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: jnp.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: jnp.dtype(ml_dtypes.float8_e5m2fnuz),
    torch.float8_e8m0fnu: jnp.dtype(ml_dtypes.float8_e8m0fnu),
    # Two float4 values packed in a byte: storage only (CPU PyTorch computes nothing in it but
    # byte moves and bytewise equality). Held in a one-byte XLA type torch does not have, so it
    # keeps its own identity in keys and results; this one (one NaN, no -0, every value exact in
    # float16) survives any float round trip XLA may insert bit for bit. ops/_common.is_float
    # says False for it, and comparisons read its bytes (ops/promotion.py).
    torch.float4_e2m1fn_x2: jnp.dtype(ml_dtypes.float8_e4m3b11fnuz),
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}

# Dtypes XLA has no element type for, each carried in the buffer of a same-size torch dtype XLA
# has (eager/carried.py serves their ops): the sub-byte and bits dtypes are storage only on CPU
# (copies, cat, views; no arithmetic), so their bytes ride as uint8 (bits16: uint16); complex32
# is two float16s, real then imaginary, carried as the uint32 of their bits (not as complex64:
# that would double its bytes, and `.view(torch.int32)`, `.view(torch.float16)`, storage sizes
# and byte transfers must see CPU's 4-byte layout). They map to the carrier's XLA type one
# way only: JAX_TO_TORCH keeps uint8 -> torch.uint8.
SUB_BYTE = (torch.uint1, torch.uint2, torch.uint3, torch.uint4, torch.uint5, torch.uint6, torch.uint7,
            torch.int1, torch.int2, torch.int3, torch.int4, torch.int5, torch.int6, torch.int7)
BITS = (torch.bits1x8, torch.bits2x4, torch.bits4x2, torch.bits8, torch.bits16)
CARRIED: dict[torch.dtype, torch.dtype] = {d: torch.uint8 for d in SUB_BYTE + BITS}
CARRIED[torch.bits16] = torch.uint16
CARRIED[torch.complex32] = torch.uint32
for _d, _c in CARRIED.items():
    TORCH_TO_JAX[_d] = TORCH_TO_JAX[_c]

# numpy has no bfloat16 or float8 that torch reads: host transfers reinterpret bits through a
# same-size int.
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu)
# the one-byte float storage types: float8 and packed float4
NARROW_FLOATS = frozenset(FLOAT8 + (torch.float4_e2m1fn_x2,))
_BITCAST_VIA = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
for _t in NARROW_FLOATS:
    _BITCAST_VIA[_t] = (torch.uint8, TORCH_TO_JAX[_t])
_NUMPY_VIA = {np.dtype(v[1]): (v[0], k) for k, v in _BITCAST_VIA.items()}
for _d, _c in CARRIED.items():  # to the host as the carrier's numpy type (one way: see CARRIED)
    _BITCAST_VIA[_d] = (_c, TORCH_TO_JAX[_c])


# set once a tensor of a CARRIED dtype is made on tpu: from then on kernels check their calls
# for one (eager/carried.py); until then that check costs one list read
CARRIED_SEEN = [False]


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        found = TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"torchtpu: dtype {dtype} is not supported on the tpu device") from None
    if dtype in CARRIED:
        CARRIED_SEEN[0] = True
    return found


def to_torch_dtype(dtype) -> torch.dtype:
    found = JAX_TO_TORCH.get(dtype)  # an array's np.dtype (per output of every call): no conversion
    return found if found is not None else JAX_TO_TORCH[jnp.dtype(dtype)]


_device = None


def device() -> jax.Device:
    """This process's home XLA device (a TPU if present, else a GPU, else the host CPU): its
    first local one, or the one a distributed run's collectives use (set_home). Tensors on
    other local devices are placed by runtime/placement.py."""
    global _device
    if _device is None:
        _device = jax.local_devices()[0]
    return _device


def set_home(d: jax.Device) -> None:
    """Make `d` the home device (distributed bring-up: each process's own)."""
    global _device
    _device = d


def platform() -> str:
    return device().platform


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A private copy of a CPU tensor's value as a numpy array (bfloat16 via ml_dtypes).

    Always a copy: Tensor.numpy() would mark the caller's storage non-resizable, and
    XLA:CPU may alias the array it is given instead of copying it.
    """
    t = t.detach().resolve_conj().resolve_neg()
    carrier = CARRIED.get(t.dtype)
    if carrier is not None:  # CPU cannot clone most of them: their bits, as the carrier
        return t.view(carrier).clone(memory_format=torch.contiguous_format).numpy()
    t = t.clone(memory_format=torch.contiguous_format)
    via = _BITCAST_VIA.get(t.dtype)
    if via is not None:
        return t.view(via[0]).numpy().view(via[1])
    return t.numpy()


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    if not a.flags.writeable:
        a = a.copy()  # device arrays read back on XLA:CPU are read-only views
    a = np.ascontiguousarray(a)
    via = _NUMPY_VIA.get(a.dtype)
    if via is not None:
        return torch.from_numpy(a.view(TORCH_TO_JAX[via[0]])).view(via[1])
    return torch.from_numpy(a)
