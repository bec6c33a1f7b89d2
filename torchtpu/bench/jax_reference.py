"""The benchmark models written directly in JAX: the baseline torch.compile(backend="tpu")
is measured against. Parameters come from the PyTorch model's state_dict (same names,
same values), so the JAX loss at step 0 equals the PyTorch one and the comparison is
between equal programs, not merely equal shapes."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch


def params_of(module: torch.nn.Module) -> tuple[dict, dict]:
    """(trainable parameters, buffers) as float32 jax arrays keyed by state_dict names."""
    params = {n: jnp.asarray(p.detach().cpu().numpy()) for n, p in module.named_parameters()}
    buffers = {
        n: jnp.asarray(b.detach().cpu().numpy()) for n, b in module.named_buffers()
        if b.dtype.is_floating_point
    }
    return params, buffers


def _linear(p, name, x):
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def _layer_norm(p, name, x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def _cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1).mean()


def gpt_loss(p, idx, targets, layers: int, heads: int):
    """TinyGPT (torchtpu.bench.models) forward + mean cross entropy."""
    b, t = idx.shape
    x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
    d = x.shape[-1]
    dh = d // heads
    mask = jnp.tril(jnp.ones((t, t), bool))
    for i in range(layers):
        pre = f"blocks.{i}."
        qkv = _linear(p, pre + "qkv", _layer_norm(p, pre + "ln1", x))
        q, k, v = (z.reshape(b, t, heads, dh).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, axis=-1))
        att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh), -jnp.inf)
        y = jax.nn.softmax(att, axis=-1) @ v
        x = x + _linear(p, pre + "proj", y.transpose(0, 2, 1, 3).reshape(b, t, d))
        h = jax.nn.gelu(_linear(p, pre + "fc", _layer_norm(p, pre + "ln2", x)), approximate=False)
        x = x + _linear(p, pre + "out", h)
    logits = _linear(p, "head", _layer_norm(p, "ln", x))
    return _cross_entropy(logits.reshape(b * t, -1), targets.reshape(-1)), {}


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(1, 1), (1, 1)], dimension_numbers=("NCHW", "OIHW", "NCHW")
    )


def _batch_norm(p, bufs, name, x, new_bufs, momentum=0.1, eps=1e-5):
    mean = x.mean((0, 2, 3))
    var = x.var((0, 2, 3))
    n = x.size / x.shape[1]
    new_bufs[name + ".running_mean"] = (1 - momentum) * bufs[name + ".running_mean"] + momentum * mean
    new_bufs[name + ".running_var"] = (1 - momentum) * bufs[name + ".running_var"] + momentum * var * n / (n - 1)
    xhat = (x - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + eps)
    return xhat * p[name + ".weight"][None, :, None, None] + p[name + ".bias"][None, :, None, None]


def resnet_loss(p, bufs, x, targets):
    """SmallResNet (torchtpu.bench.compile) in training mode + mean cross entropy;
    returns the loss and the updated BatchNorm running statistics."""
    nb = {}

    def cbr(name_conv, name_bn, x, stride=1, relu=True):
        y = _batch_norm(p, bufs, name_bn, _conv(x, p[name_conv + ".weight"], stride), nb)
        return jax.nn.relu(y) if relu else y

    x = cbr("stem.0", "stem.1", x)
    for blk, stride in (("block1", 1), ("down", 2), ("block2", 1)):
        if blk == "down":
            x = cbr("down.0", "down.1", x, stride=2)
            continue
        y = cbr(f"{blk}.conv1", f"{blk}.bn1", x)
        y = cbr(f"{blk}.conv2", f"{blk}.bn2", y, relu=False)
        x = jax.nn.relu(x + y)
    x = x.mean((2, 3))
    logits = _linear(p, "fc", x)
    return _cross_entropy(logits, targets), nb


def adamw(p, g, state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    """torch.optim.AdamW's update, step counter included."""
    m, v, t = state
    t = t + 1
    bc1 = 1 - b1 ** t
    bc2 = 1 - b2 ** t
    new_p, new_m, new_v = {}, {}, {}
    for k in p:
        mk = b1 * m[k] + (1 - b1) * g[k]
        vk = b2 * v[k] + (1 - b2) * g[k] * g[k]
        pk = p[k] * (1 - lr * wd)
        denom = jnp.sqrt(vk) / jnp.sqrt(bc2) + eps
        new_p[k] = pk - (lr / bc1) * mk / denom
        new_m[k], new_v[k] = mk, vk
    return new_p, (new_m, new_v, t)


def adamw_init(p):
    return ({k: jnp.zeros_like(v) for k, v in p.items()}, {k: jnp.zeros_like(v) for k, v in p.items()},
            jnp.zeros((), jnp.float32))


def make_step(loss_fn):
    """One jitted training step: forward, backward and AdamW in a single program."""

    def step(p, bufs, opt_state, *batch):
        (loss, new_bufs), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, bufs, *batch)
        p, opt_state = adamw(p, grads, opt_state)
        bufs = {**bufs, **new_bufs}
        return p, bufs, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def to_jax(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(np.asarray(t.detach().cpu().numpy()))
