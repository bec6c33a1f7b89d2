"""torch.autocast for device_type "tpu": the op policy PyTorch applies on CUDA.

PyTorch ships autocast kernels for CUDA, CPU, XPU, MPS... but none for PrivateUse1:
an out-of-tree backend registers its own at the AutocastPrivateUse1 key (as
torch_openreg and other PrivateUse1 backends do in C++). These are the same five
policies as aten/src/ATen/autocast_mode.h, over the same op lists (its
AT_FORALL_* macros), written in Python and registered with torch.library:

- lower_precision_fp: cast floating tpu inputs to the autocast dtype;
- fp32: cast them to float32;
- fp32_set_opt_dtype: ask for a float32 result through the op's `dtype=`;
- fp32_append_dtype: redispatch norm to its overload that takes a dtype;
- promote: run in the widest floating dtype among the inputs.

Every other op falls through. A kernel runs its op with the autocast key excluded,
as C++ does, so the ops a composite (linear, matmul) decomposes into are not cast
again. Under torch.compile the same kernels run while aot_autograd traces, so the
casts become part of the graph.

The autocast dtype defaults to PyTorch's for PrivateUse1 (float16, as on CUDA); TPU
code passes dtype=torch.bfloat16.
"""
from __future__ import annotations

import weakref

import torch

from ..runtime import cache as _caches

LOWER = "lower_precision_fp"
FP32 = "fp32"
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
FP32_APPEND_DTYPE = "fp32_append_dtype"
PROMOTE = "promote"

# aten/src/ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP (torch 2.13)
_LOWER = """
_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum
mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell
_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
_scaled_dot_product_flash_attention scaled_dot_product_attention
"""
# AT_FORALL_FP32
_FP32 = """
acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar
pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm group_norm
frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss
huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d
upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
_upsample_bicubic2d_aa
"""
# AT_FORALL_FP32_SET_OPT_DTYPE
_FP32_SET_OPT_DTYPE = """
prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList
"""
# AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE: overload -> the overload that takes a dtype
_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
# AT_FORALL_PROMOTE
_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"

POLICY: dict[str, str] = {}
for _names, _policy in ((_LOWER, LOWER), (_FP32, FP32), (_FP32_SET_OPT_DTYPE, FP32_SET_OPT_DTYPE),
                        (" ".join(_APPEND_DTYPE), FP32_APPEND_DTYPE), (_PROMOTE, PROMOTE)):
    for _n in _names.split():
        POLICY[_n] = _policy

_BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_NO_AUTOCAST = torch._C.DispatchKeySet(_KEY)


def _overload(name: str):
    base, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), ov or "default")


def _eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == "tpu" and t.is_floating_point()
            and t.dtype is not torch.float64)


# The C++ cache keeps float->lower-precision casts of leaf weights that need grad until the
# outermost autocast exits (torch.clear_autocast_cache). A Python backend sees no exit, so the
# cast is held weakly: reused while anything (autograd's saved tensors, a second use in the
# same forward) keeps it alive, and never outliving its use. The source's version counter
# keeps an in-place update (an optimizer step) from reusing a stale cast.
_cache: dict[int, tuple] = _caches.register("autocast casts", {})  # entries leave with their cast


def _cast(to, t):
    if not _eligible(t) or t.dtype is to:
        return t
    cacheable = (to is not torch.float32 and t.dtype is torch.float32 and t.requires_grad
                 and t.is_leaf and not t._is_view() and torch.is_autocast_cache_enabled()
                 and not isinstance(t, torch._subclasses.FakeTensor))
    if cacheable:
        hit = _cache.get(id(t))
        if hit is not None:
            src, version, dtype, out = hit
            out = out()
            if src() is t and version == t._version and dtype is to and out is not None:
                return out
        out = t.to(to)
        # `pop` bound now: a parameter dying at interpreter exit finds `_cache` already None
        _cache[id(t)] = (weakref.ref(t, lambda _, k=id(t), pop=_cache.pop: pop(k, None)),
                         t._version, to, weakref.ref(out))
        return out
    return t.to(to)


def _cast_all(to, args, kwargs):
    def one(v):
        if isinstance(v, torch.Tensor):
            return _cast(to, v)
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(one(x) for x in v)
        return v

    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _promote_type(lower, args, kwargs):
    """at::autocast::promote_type: float32 wins over the lower precision; double is ignored."""
    current = lower
    for t in _tensors(args, kwargs):
        if not _eligible(t):
            continue
        if t.dtype is torch.float32 or current is torch.float32:
            current = torch.float32
        elif t.dtype is not lower or current is not lower:
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _first_eligible(args, kwargs) -> bool:
    first = args[0] if args else next(iter(kwargs.values()), None)
    return _eligible(first)


def _kernel(name: str, policy: str):
    op = _overload(name)
    if policy == FP32_SET_OPT_DTYPE:
        names = [a.name for a in op._schema.arguments]
        dtype_pos = names.index("dtype")
        positional = not op._schema.arguments[dtype_pos].kwarg_only
    if policy == FP32_APPEND_DTYPE:
        target = _overload(_APPEND_DTYPE[name])
        schema_args = op._schema.arguments

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            if policy == LOWER:
                args, kwargs = _cast_all(torch.get_autocast_dtype("tpu"), args, kwargs)
            elif policy == FP32:
                args, kwargs = _cast_all(torch.float32, args, kwargs)
            elif policy == PROMOTE:
                to = _promote_type(torch.get_autocast_dtype("tpu"), args, kwargs)
                args, kwargs = _cast_all(to, args, kwargs)
            elif policy == FP32_SET_OPT_DTYPE:
                # an explicit dtype wins; an ineligible first input runs unaltered
                if _first_eligible(args, kwargs):
                    if positional and len(args) > dtype_pos:
                        if args[dtype_pos] is None:
                            args = list(args)
                            args[dtype_pos] = torch.float32
                    elif kwargs.get("dtype") is None:
                        kwargs = dict(kwargs, dtype=torch.float32)
            else:  # FP32_APPEND_DTYPE
                # the dtype overload takes every argument explicitly: fill in the defaults
                full = list(args) + [kwargs[a.name] if a.name in kwargs else a.default_value
                                     for a in schema_args[len(args):]]
                out = torch.float32 if _eligible(full[0]) else full[0].dtype
                return target(*full, dtype=out)
            return op(*args, **kwargs)

    kernel.__name__ = f"autocast_{name.replace('.', '_')}"
    return kernel


def _banned(message):
    def kernel(*args, **kwargs):
        raise RuntimeError(message)

    return kernel


_libs: list = []


def install() -> None:
    """Register the policy at AutocastPrivateUse1 and a fallthrough for every other op."""
    if _libs:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for name, policy in POLICY.items():
        lib.impl(name, _kernel(name, policy), "AutocastPrivateUse1")
    for name, message in _BANNED.items():
        lib.impl(name, _banned(message), "AutocastPrivateUse1")
    _libs.extend([fallthrough, lib])
