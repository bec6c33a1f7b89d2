"""Sizes that vary from call to call: programs compiled and wall time, next to torch CPU
eager in the same run, with the varying-size policy (TORCHTPU_VARYING_AFTER,
eager/extents.py and eager/dynamism.py) off and on.

    python -m torchtpu.bench churn [--only fill,index,train,llama,batching,compiled] [--mode strict]

Workloads (each from empty executable caches, run three times: cold, warm on new sizes of
the same ranges, and those sizes again, once every bucket they need has run):
  fill      a preallocated mask filled over a growing corner, buf[:q, :q + 7].fill_, 32 sizes
  index     index_select over 32 index lengths
  train     an embedding-MLP with AdamW, 24 steps of a batch length drawn from 17..512
  llama     fine-tuning a tiny Llama (hidden 64, 2 layers) with AdamW, 8 steps of lengths 17..512
  batching  Transformers' continuous batching (generate_batch, paged sdpa, no padding
            settings) of a tiny Llama: 8 requests x 32 new tokens, then 8 more
  compiled  torch.compile of a tiny Llama's forward (inference) over 8 prompt lengths in
            17..200 (torch CPU: the same forward, eager)

Reported per workload and policy: programs compiled and seconds cold, warm and again, the
warm and again ratios to torch CPU eager (over the warm sizes), the host memory the programs kept hold after both runs
(torchtpu.executable_memory(), what set_executable_limit(total_bytes=) bounds), whether the
outputs equal CPU's. Then, per workload, the ATen ops its warm pass issues (counted on CPU)
times PJRT's dispatch of one small program (a jax.jit call, measured in the same run): the
warm time an op-by-op backend cannot go below here, as a ratio to CPU's.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import torchtpu

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _fill(dev, sizes):
    buf = torch.zeros(64, 96, device=dev)
    for q in sizes:
        buf[:q, :q + 7].fill_(-float(q))
        buf[:q, :q + 7].triu_(1)
    return [buf]


def _index(dev, sizes):
    g = torch.Generator().manual_seed(sizes[0])
    w = torch.randn(1000, 64, generator=g).to(dev)
    return [torch.index_select(w, 0, torch.randint(0, 1000, (q,), generator=g).to(dev)) * 2 for q in sizes]


def _train(dev, sizes):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 64), torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 256)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(sizes[0])
    losses = []
    for n in sizes:
        ids = torch.randint(0, 256, (1, n), generator=g).to(dev)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [torch.stack(losses)]


_LLAMA = None


def _tiny_llama():
    global _LLAMA
    from transformers import LlamaConfig, LlamaForCausalLM

    if _LLAMA is None:
        cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
        torch.manual_seed(0)
        _LLAMA = LlamaForCausalLM(cfg).eval()
    return _LLAMA


def _llama(dev, sizes):
    """Fine-tuning a tiny Llama (a copy, AdamW) on one sequence per step, its length drawn anew."""
    import copy

    model = copy.deepcopy(_tiny_llama()).train().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(sizes[0])
    losses = []
    for n in sizes:
        ids = torch.randint(0, 128, (1, n), generator=g).to(dev)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [torch.stack(losses)]


def _batching(dev, sizes):
    from transformers import ContinuousBatchingConfig, GenerationConfig

    import copy

    model = copy.deepcopy(_tiny_llama())  # (moved to dev: the shared model stays on the CPU)
    g = torch.Generator().manual_seed(sizes[0])
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in sizes]
    gen = GenerationConfig(max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=2, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=256)
    out = model.to(dev).generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                                        progress_bar=False)
    return [torch.tensor(out[k].generated_tokens) for k in sorted(out)]


_COMPILED: dict = {}  # device -> the compiled model of this policy's runs (_fresh empties it)


def _compiled(dev, sizes):
    """A tiny Llama's forward under torch.compile (on CPU: eager, the baseline) over prompts of
    the given lengths; Dynamo makes the length symbolic at the second one."""
    model = _COMPILED.get(dev)
    if model is None:
        import copy

        model = copy.deepcopy(_tiny_llama()).to(dev)
        if dev != "cpu":
            model = torch.compile(model, backend="tpu")
        _COMPILED[dev] = model
    g = torch.Generator().manual_seed(sizes[0])
    outs = []
    with torch.no_grad():
        for n in sizes:
            ids = torch.randint(0, 128, (1, n), generator=g).to(dev)
            outs.append(model(input_ids=ids).logits[0, -1])
    return outs  # each read back alone: a stack would be one more program, the bench's own


def _fresh() -> None:
    """Before a policy's cold run: no compiled model, no Dynamo cache from the other policy."""
    _COMPILED.clear()
    torch._dynamo.reset()


def _draw(lo, hi, k, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(x) for x in torch.randint(lo, hi + 1, (k,), generator=g)]


WORKLOADS = {
    "fill": (_fill, list(range(1, 33)), list(range(32, 0, -1))),
    "index": (_index, list(range(1, 33)), list(range(40, 8, -1))),
    "train": (_train, _draw(17, 512, 24, 1), _draw(17, 512, 24, 2)),
    "llama": (_llama, _draw(17, 512, 8, 1), _draw(17, 512, 8, 2)),
    "batching": (_batching, _draw(4, 24, 8, 1), _draw(4, 24, 8, 2)),
    "compiled": (_compiled, _draw(17, 200, 8, 1), _draw(17, 200, 8, 2)),
}


def _programs() -> int:
    # "compiles" counts every program: an op's, a fused region's and a compiled graph's
    # (compile_graphs is the share of the last, not more of them)
    return torchtpu.metrics().get("compiles", 0)


def _run(fn, dev, sizes):
    t0 = time.perf_counter()
    before = _programs()
    out = [o.cpu() for o in fn(dev, sizes)]
    return out, time.perf_counter() - t0, _programs() - before


def _ops_issued(fn, sizes) -> int:
    """The ATen ops fn("cpu", sizes) issues (a dispatch mode counting them): what an eager
    backend dispatches one by one for the same work."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn("cpu", sizes)
    return Count.n


def _dispatch_floor_us(iters: int = 300, repeats: int = 7) -> float:
    """PJRT's own dispatch here: a jax.jit call of a 16x16 add on device arrays, best of
    `repeats` (bench eager's floor)."""
    from .eager import _floor

    x = torch.randn(16, 16)
    return _floor(lambda a, b: a + b, x, x, iters, repeats)


def _device_share(fn, sizes) -> tuple[float, float]:
    """(wall seconds, seconds the device programs ran) of fn("tpu", sizes) under torch's
    profiler (device/profiler.py: each program's interval from when it could start to when
    its outputs were ready). On XLA:CPU the device is these same two cores. A program of a
    few microseconds reads longer than it ran (the profiler's waiter thread stamps its end)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _, wall, _ = _run(fn, "tpu", sizes)
    dev = sum(e.device_time_total for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.PrivateUse1) / 1e6
    return wall, dev


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x.float(), y.float(), atol=1e-5, rtol=1e-5)
                                    for x, y in zip(a, b))


def main(argv=None) -> int:
    from ..eager import extents

    ap = argparse.ArgumentParser(prog="python -m torchtpu.bench churn")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--mode", default="strict", choices=["strict", "defer_and_fuse"])
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    after = extents.AFTER or 1
    rows = []
    floor_us = _dispatch_floor_us()
    issued, device = {}, {}
    for k, name in enumerate(names):
        fn, cold_sizes, warm_sizes = WORKLOADS[name]
        print(f"[{k + 1}/{len(names)}] {name} ...", flush=True)
        _run(fn, "cpu", cold_sizes)  # CPU's own warm-up (imports, allocator)
        ref_cold, cpu_cold, _ = _run(fn, "cpu", cold_sizes)
        ref_warm, cpu_warm, _ = _run(fn, "cpu", warm_sizes)
        # (compiled: a graph over a size Dynamo made symbolic runs op by op through the
        # deferred executor, one program per bucket: compile/runtime.CompiledGraph.varying)
        issued[name] = (_ops_issued(fn, warm_sizes), cpu_warm)
        for policy in ("off", "on"):
            extents.AFTER = 0 if policy == "off" else after
            torchtpu.clear_caches()
            _fresh()
            with torchtpu.eager_mode(args.mode):
                got_cold, t_cold, p_cold = _run(fn, "tpu", cold_sizes)
                got_warm, t_warm, p_warm = _run(fn, "tpu", warm_sizes)
                # the warm sizes again: every bucket they need has run once (issue 32's "warm")
                got_again, t_again, p_again = _run(fn, "tpu", warm_sizes)
                if policy == "on":
                    device[name] = _device_share(fn, warm_sizes)
            held = torchtpu.executable_memory() / 2**20  # the programs the runs kept
            rows.append((name, policy, p_cold, p_warm, p_again, t_cold, t_warm, t_again, cpu_warm, held,
                         _equal(got_cold, ref_cold) and _equal(got_warm, ref_warm) and _equal(got_again, ref_warm)))
    extents.AFTER = after
    print(f"\nvarying sizes, {args.mode} eager on tpu ({torch.tpu.get_device_name()}) vs torch CPU eager "
          "(programs compiled; seconds; host MB the kept programs hold)")
    head = (f"{'workload':<10}{'policy':>7}{'programs cold':>15}{'warm':>6}{'again':>7}{'s cold':>9}{'s warm':>9}"
            f"{'again':>8}{'cpu s':>8}{'warm/cpu':>10}{'again/cpu':>11}{'exe MB':>8}{'equal':>7}")
    print(head)
    print("-" * len(head))
    for name, policy, pc, pw, pa, tc, tw, ta, cw, mb, eq in rows:
        print(f"{name:<10}{policy:>7}{pc:>15}{pw:>6}{pa:>7}{tc:>9.2f}{tw:>9.2f}{ta:>8.2f}{cw:>8.2f}"
              f"{tw / max(cw, 1e-9):>10.1f}{ta / max(cw, 1e-9):>11.1f}{mb:>8.1f}{'yes' if eq else 'NO':>7}")
    # What the warm ratio cannot go below here when each op is dispatched (strict) or recorded
    # (defer_and_fuse, whose target is the same floor: issue 33) by itself: the ATen ops the
    # warm pass issues times PJRT's dispatch of one small program, against CPU's whole pass.
    # And how much of a pass, once every program exists, is the device's own work: on XLA:CPU
    # the programs run on the cores the host and torch CPU use.
    print(f"\ndispatch floor (jax.jit call of a 16x16 add, this run): {floor_us:.1f} us per op; "
          "device: the warm sizes once more, policy on, under torch.profiler")
    head = (f"{'workload':<10}{'ATen ops, warm':>16}{'floor s':>9}{'cpu s':>8}{'floor/cpu':>11}"
            f"{'wall s':>8}{'device s':>10}{'device/cpu':>12}")
    print(head)
    print("-" * len(head))
    for name, (ops, cw) in issued.items():
        fl = ops * floor_us * 1e-6
        wall, dev = device.get(name, (float("nan"), float("nan")))
        print(f"{name:<10}{ops:>16}{fl:>9.3f}{cw:>8.3f}{fl / max(cw, 1e-9):>11.1f}"
              f"{wall:>8.3f}{dev:>10.3f}{dev / max(cw, 1e-9):>12.1f}")
    return 0 if all(r[-1] for r in rows) else 1
