"""Hugging Face training and serving stacks on tpu as a new user runs them (issue 30).

Accelerate/Trainer in fp16, `torch_compile_backend="tpu"`, continuous batching's cache sizing, TRL's SFT,
DPO and GRPO, PEFT LoRA under Trainer and `transformers serve`, each next to the same run on the CPU.
Everything is tiny and made here: a one-layer Llama with random weights and a word-level tokenizer.
The fast tests run in `make test`; the recipes are `slow`.
"""
import copy
import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.request

import pytest
import torch

import torchtpu  # noqa: F401
from conftest import assert_same, assert_values

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "user", "assistant", ":"] + [f"w{i}" for i in range(50)]
LLAMA = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# a chat is "user : w1 w2 </s> assistant : w3 </s>"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}assistant : {% endif %}")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps its state process-wide: each test starts from none, whatever ran before it in this
    worker (a Trainer in another file leaves an AcceleratorState behind), and leaves none for the next."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama and its tokenizer in a local directory, as from_pretrained, TRL and serve load them."""
    path = tmp_path_factory.mktemp("tiny-llama")
    llama().save_pretrained(path)
    tokenizer().save_pretrained(path)
    return str(path)


def pretrained(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def sentences(n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{i}" for i in torch.randint(0, 50, (length,), generator=g).tolist()) for _ in range(n)]


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=24, length=12):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(7, 57, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _args(out, steps, **kwargs):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out), max_steps=steps, seed=0, report_to=[], logging_steps=1,
                             disable_tqdm=True, per_device_train_batch_size=4, learning_rate=1e-2,
                             save_strategy="no", **kwargs)


# ---- fast: the integration layer (torchtpu/device/accelerate_support.py) -------------------------------


def test_accelerator_fp16_on_tpu_scales_and_autocasts():
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="fp16")  # raised "fp16 mixed precision requires a device in (...)"
    assert acc.device.type == "tpu" and acc.native_amp
    assert isinstance(acc.scaler, torch.amp.GradScaler) and acc.scaler._device == "tpu" and acc.scaler.is_enabled()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before prepare, as Accelerate's docs do it
    model, opt = acc.prepare(model, opt)
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    before = model[0].weight.detach().cpu()
    loss = model(torch.randn(4, 8, device="tpu")).float().square().mean()
    acc.backward(loss)
    opt.step()
    assert seen == [torch.float16]  # autocast("tpu", float16) around the forward
    # the optimizer steps the parameters on tpu (it held the CPU ones before prepare mapped them)
    assert {p.device.type for g in opt.param_groups for p in g["params"]} == {"tpu"}
    assert not torch.equal(model[0].weight.detach().cpu(), before)


def test_accelerate_imported_before_torch():
    """`import accelerate` first runs accelerate/accelerator.py down to its `import torch`, whose autoload installs
    the integration while `Accelerator` does not exist yet: it is mended once that import finishes (this crashed
    the `accelerate` CLI once)."""
    code = ("import accelerate\n"
            "from accelerate import Accelerator\n"
            "from accelerate.utils import DynamoBackend\n"
            "a = Accelerator(mixed_precision='fp16')\n"
            "print(a.device.type, a.scaler._device, DynamoBackend('TPU').value)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["tpu", "tpu", "TPU"]


def test_dynamo_backend_name_tpu():
    from accelerate.utils import DynamoBackend, TorchDynamoPlugin

    assert DynamoBackend("TPU") is DynamoBackend.TPU is DynamoBackend["TPU"] and "TPU" in DynamoBackend.list()
    assert TorchDynamoPlugin(backend="tpu").to_kwargs()["backend"] == "tpu"  # torch.compile(backend="tpu")
    args = _args("unused", 1, torch_compile=True, torch_compile_backend="tpu")
    from accelerate import Accelerator

    acc = Accelerator(dynamo_backend=args.torch_compile_backend)  # raised "'TPU' is not a valid DynamoBackend"
    cpu = torch.nn.Linear(4, 2)
    model = acc.prepare(copy.deepcopy(cpu))
    assert type(model).__name__ == "OptimizedModule" and model.weight.device.type == "tpu"
    x = torch.randn(3, 4)
    assert_same(model(x.to("tpu")), cpu(x))


def test_device_map_auto_places_on_tpu(saved):
    from accelerate.utils import get_max_memory
    from transformers import AutoModelForCausalLM

    budget = get_max_memory()
    assert list(budget)[0] == 0 and "cpu" in budget  # tpu:0 first, as cuda:0 on a cuda machine
    model = AutoModelForCausalLM.from_pretrained(saved, device_map="auto")  # planned on the CPU before
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    ids = torch.tensor([[1, 9, 13, 20]])
    assert_same(model(ids.to("tpu")).logits, pretrained(saved)(ids).logits, atol=1e-5, rtol=1e-5)


def test_continuous_batching_sizes_cache_from_device_memory(monkeypatch):
    from transformers.generation.continuous_batching import cache, utils

    gib = 1024**3
    monkeypatch.setattr(torch.tpu, "mem_get_info", lambda *a: (12 * gib, 16 * gib))
    monkeypatch.setattr(torch.tpu, "memory_reserved", lambda *a: 3 * gib)
    device, total, reserved, allocated = utils.get_device_and_memory_breakdown()
    assert (device.type, total, reserved, allocated) == ("tpu", 16 * gib, 3 * gib, 4 * gib)
    # the cache's memory handler sizes from what the device has free, as on cuda, not from host RAM
    handler = types.SimpleNamespace(cb_config=types.SimpleNamespace(max_memory_percent=0.5))
    assert cache.PagedAttentionMemoryHandler.get_available_memory(handler) == 6 * gib


def test_trainer_fp16_matches_cpu_autocast(tmp_path):
    from transformers import Trainer

    transformers.logging.set_verbosity_error()
    # CPU reference: the same Trainer with Accelerate's fp16 machinery turned on by hand (Accelerate allows
    # fp16 on no CPU): autocast("cpu", float16) around the forward, a CPU GradScaler
    ref = Trainer(model=llama(), args=_args(tmp_path / "cpu", 3, use_cpu=True, fp16=True), train_dataset=_Tokens())
    ref.accelerator.native_amp = True
    ref.accelerator.scaler = torch.amp.GradScaler("cpu")
    ref.train()
    trainer = Trainer(model=llama(), args=_args(tmp_path / "tpu", 3, fp16=True), train_dataset=_Tokens())
    seen = []
    trainer.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    trainer.train()
    assert trainer.accelerator.device.type == "tpu" and trainer.accelerator.scaler._device == "tpu"
    assert set(seen) == {torch.float16}
    assert len(losses(trainer)) == 3
    assert_values(losses(trainer), losses(ref), atol=1e-4, rtol=1e-4)
    assert trainer.accelerator.scaler.get_scale() == ref.accelerator.scaler.get_scale()


# ---- slow: the recipes, each next to the same run on the CPU ---------------------------------------


def _both(run, tmp_path, **kwargs):
    """run(out_dir, use_cpu) on the CPU and then on tpu (the device Accelerate picks by default)."""
    transformers.logging.set_verbosity_error()
    cpu = run(tmp_path / "cpu", use_cpu=True, **kwargs)
    assert cpu.accelerator.device.type == "cpu"  # before the next run resets Accelerate's shared state
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    tpu = run(tmp_path / "tpu", use_cpu=False, **kwargs)
    assert tpu.accelerator.device.type == "tpu"
    assert {p.device.type for p in cpu.model.parameters()} == {"cpu"}
    assert {p.device.type for p in tpu.model.parameters()} == {"tpu"}
    print("losses cpu", losses(cpu), "tpu", losses(tpu))  # shown with -s
    return cpu, tpu


def _trl_args(config_cls, out, use_cpu, steps=3, **kwargs):
    # TRL's own defaults stay (bf16 autocast, gradient checkpointing), as a user gets them
    return config_cls(output_dir=str(out), max_steps=steps, seed=0, report_to=[], logging_steps=1, disable_tqdm=True,
                      per_device_train_batch_size=4, learning_rate=1e-2, save_strategy="no", use_cpu=use_cpu,
                      **kwargs)


@pytest.mark.slow
def test_trl_sft_matches_cpu(tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({"text": sentences(16, 10, seed=1)})

    dtypes = {True: set(), False: set()}

    def run(out, use_cpu):
        trainer = SFTTrainer(model=llama(), args=_trl_args(SFTConfig, out, use_cpu, max_length=16),
                             train_dataset=data, processing_class=tokenizer())
        mlp = trainer.model.model.layers[0].mlp.down_proj
        mlp.register_forward_hook(lambda m, i, o: dtypes[use_cpu].add(o.dtype))
        trainer.train()
        return trainer

    cpu, tpu = _both(run, tmp_path)
    assert tpu.args.bf16 and tpu.args.gradient_checkpointing
    assert dtypes[False] == dtypes[True] == {torch.bfloat16}  # Accelerate's bf16 autocast, on tpu as on the CPU
    assert len(losses(tpu)) == 3
    assert_values(losses(tpu), losses(cpu), atol=2e-3, rtol=1e-3)  # bf16 autocast on both


@pytest.mark.slow
def test_trl_dpo_matches_cpu(tmp_path, saved):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    # completions start with a space: the word-level tokenizer splits only on whitespace
    prompts = sentences(8, 4, seed=2)
    chosen, rejected = [[" " + s for s in sentences(8, 5, seed=k)] for k in (3, 4)]
    data = Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})

    def run(out, use_cpu):
        # the reference model is a frozen copy of the policy, made by DPOTrainer
        trainer = DPOTrainer(model=pretrained(saved), args=_trl_args(DPOConfig, out, use_cpu, max_length=16),
                             train_dataset=data, processing_class=tokenizer())
        trainer.train()
        return trainer

    cpu, tpu = _both(run, tmp_path)
    assert len(losses(tpu)) == 3
    assert_values(losses(tpu), losses(cpu), atol=2e-3, rtol=1e-3)  # bf16 autocast on both
    margins = [[h["rewards/margins"] for h in t.state.log_history if "rewards/margins" in h] for t in (tpu, cpu)]
    assert_values(margins[0], margins[1], atol=2e-3, rtol=1e-2)


def _shared_draws():
    """torch.multinomial by inverse CDF with uniforms from one seeded CPU generator. Each device's RNG draws its
    own numbers (tpu's are not CPU's, as cuda's are not), so for sampled generations to be comparable both runs
    take the same uniforms; the probabilities are still each device's own."""
    g = torch.Generator().manual_seed(0)

    def multinomial(probs, num_samples, replacement=False, *, generator=None, out=None):
        assert num_samples == 1 and out is None
        p = probs.detach().float().cpu()
        cdf = p.cumsum(-1)
        u = torch.rand(p.shape[:-1] + (1,), generator=g) * cdf[..., -1:]
        return torch.searchsorted(cdf, u).clamp(max=p.shape[-1] - 1).to(probs.device)

    return multinomial


def _low_words(completions, **kwargs):
    """A trivial reward: how many words of the completion are w0..w24."""
    return [float(sum(w.startswith("w") and int(w[1:]) < 25 for w in c.split())) for c in completions]


@pytest.mark.slow
def test_trl_grpo_with_generate_matches_cpu(tmp_path, saved, monkeypatch):
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_dict({"prompt": sentences(6, 4, seed=5)})
    completions = {True: [], False: []}

    def run(out, use_cpu):
        monkeypatch.setattr(torch, "multinomial", _shared_draws())

        def low_words(completions, **kwargs):  # records what HF generate produced, every step
            seen.extend(completions)
            return _low_words(completions)

        seen = completions[use_cpu]
        args = _trl_args(GRPOConfig, out, use_cpu, num_generations=4, max_completion_length=6)
        trainer = GRPOTrainer(model=pretrained(saved), reward_funcs=low_words, args=args, train_dataset=data,
                              processing_class=tokenizer())
        trainer.train()
        return trainer

    cpu, tpu = _both(run, tmp_path)
    assert len(losses(tpu)) == 3
    assert len(completions[True]) == 12 and len(set(completions[True])) > 1
    assert completions[False] == completions[True]
    rewards = [[h["reward"] for h in t.state.log_history if "reward" in h] for t in (tpu, cpu)]
    assert rewards[0] == rewards[1]
    assert_values(losses(tpu), losses(cpu), atol=2e-3, rtol=1e-3)  # bf16 autocast on both
    for (name, p), q in zip(tpu.model.named_parameters(), cpu.model.parameters()):
        assert_same(p.detach(), q.detach(), atol=2e-2, rtol=2e-2, msg=name)


@pytest.mark.slow
def test_peft_lora_with_trainer_matches_cpu(tmp_path, saved):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    def run(out, use_cpu):
        torch.manual_seed(0)  # LoRA's A matrices are drawn on the CPU, before the Trainer moves the model
        model = get_peft_model(pretrained(saved), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                             target_modules=["q_proj", "v_proj", "down_proj"]))
        trainer = Trainer(model=model, args=_args(out, 4, use_cpu=use_cpu), train_dataset=_Tokens())
        trainer.train()
        return trainer

    cpu, tpu = _both(run, tmp_path)
    assert len(losses(tpu)) == 4
    assert_values(losses(tpu), losses(cpu), atol=1e-4, rtol=1e-4)
    trained = {n: p for n, p in tpu.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    ref = dict(cpu.model.named_parameters())
    for n, p in trained.items():
        assert_same(p.detach(), ref[n].detach(), atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.slow
def test_trainer_torch_compile_backend_tpu_matches_cpu(tmp_path):
    from transformers import Trainer

    def run(out, use_cpu):
        # CPU: the same Trainer in eager; tpu: TrainingArguments' compile, through Accelerate's dynamo plugin
        kw = {} if use_cpu else dict(torch_compile=True, torch_compile_backend="tpu")
        trainer = Trainer(model=llama(), args=_args(out, 4, use_cpu=use_cpu, **kw), train_dataset=_Tokens())
        trainer.train()
        return trainer

    before = torchtpu.metrics().get("compile_graphs", 0)  # counted from the first compiled graph on
    cpu, tpu = _both(run, tmp_path)
    assert tpu.accelerator.state.dynamo_plugin.backend.value == "TPU"
    assert type(tpu.model_wrapped).__name__ == "OptimizedModule"
    assert torchtpu.metrics()["compile_graphs"] > before  # the steps ran as compiled graphs
    assert len(losses(tpu)) == 4
    assert_values(losses(tpu), losses(cpu), atol=1e-4, rtol=1e-4)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_transformers_serve_on_tpu_answers_with_cpu_greedy_tokens(saved, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from transformers import AutoTokenizer

    chats = [[{"role": "user", "content": "w1 w2 w3"}],
             [{"role": "user", "content": "w40 w7"}, {"role": "assistant", "content": "w9"},
              {"role": "user", "content": "w12 w30 w31 w2"}]]
    tok = AutoTokenizer.from_pretrained(saved)
    model = pretrained(saved).eval()
    want = []
    for messages in chats:  # CPU's greedy answer, as the server builds it: chat template, 6 new tokens
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=6, do_sample=False)[0, ids["input_ids"].shape[1]:]
        want.append((tok.decode(out, skip_special_tokens=True), len(out)))

    port = _free_port()
    log = open(tmp_path / "serve.log", "w+")
    # `transformers serve <dir> --host 127.0.0.1 --port N` (default `--device auto`: tpu), run through Transformers' own CLI entry
    # point; the wrapper only writes torchtpu's counters at exit, to show the model ran on tpu. A local
    # directory is served as it is (no Hub revision); the server imports torch, which autoloads tpu.
    # (uvicorn re-raises the SIGTERM it shut down on, so the wrapper exits on it through sys.exit)
    wrapper = ("import atexit, json, signal, sys\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
               "def report(path=sys.argv.pop(1)):\n"
               "    import torchtpu\n"
               "    json.dump(torchtpu.metrics(), open(path, 'w'))\n"
               "atexit.register(report)\n"
               "from transformers.cli.transformers import main\n"
               "sys.exit(main())\n")
    metrics = tmp_path / "metrics.json"
    server = subprocess.Popen(
        [sys.executable, "-c", wrapper, str(metrics), "serve", saved, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # until it listens (it loads torch, torchtpu and the model first), or dies
            assert server.poll() is None, open(tmp_path / "serve.log").read()
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("transformers serve never answered /health:\n" + open(tmp_path / "serve.log").read())
        for messages, (text, n) in zip(chats, want):
            reply = _post(f"{base}/v1/chat/completions",
                          {"model": saved, "messages": messages, "max_tokens": 6, "temperature": 0, "stream": False},
                          timeout=300)
            assert reply["choices"][0]["message"]["content"] == text
            assert reply["usage"]["completion_tokens"] == n
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    counters = json.loads(metrics.read_text())
    assert counters["executions"] > 0 and counters["cpu_fallbacks"] == 0, counters


@pytest.mark.slow
def test_continuous_batching_generate_batch_matches_cpu():
    from transformers import ContinuousBatchingConfig, GenerationConfig

    prompts = [[1, 9, 13, 20, 8], [1, 30, 11], [1, 40, 41, 42, 43, 44, 45]]
    gen = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=2, pad_token_id=0)
    # the cache is sized from the device's free memory (a small share of it: the model is tiny)
    cb = ContinuousBatchingConfig(max_memory_percent=0.01, max_batch_tokens=64)
    model = llama().eval()
    tokens = {}
    for dev in ("cpu", "tpu"):
        out = model.to(dev).generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                                           progress_bar=False)
        tokens[dev] = [out[k].generated_tokens for k in sorted(out)]
    assert len(tokens["tpu"]) == 3 and all(len(t) == 6 for t in tokens["tpu"])
    assert tokens["tpu"] == tokens["cpu"]
