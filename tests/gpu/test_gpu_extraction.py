"""speculators 0.3.0 or 0.4.0 + speccompat on CUDA vLLM: HF parity, MLA, llama_4_scaling, Kimi-K2.5.

Run with ``nox -s gpu`` or, on a host without a package index, pytest against staged
packages (docs/results/gpu-results.md says how).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import (
    gpu_count,
    requires_cuda,
    requires_speculators,
    requires_vllm,
    speculators_generator,
)

pytestmark = [requires_vllm, requires_speculators, requires_cuda]

# bf16 in vLLM against HF in fp32 on the same bf16 weights
# (see tests/e2e/inprocess/test_seed_pair.py).
MEAN_TOLERANCE = 0.05
MAX_TOLERANCE = 0.15
GPU_MEMORY = 0.3  # the tests share the GPU with the HF reference


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, lengths, seed=seed)


def _check(reference: list[Any], prompts: list[list[int]], results: list[dict[str, Any]],
           layer_ids: list[int], hidden: int, *, outliers: float = 0.0, min_outliers: int = 0,
           mean_tolerance: float = MEAN_TOLERANCE, token_tolerance: float = MAX_TOLERANCE,
           label: str = "") -> float:
    """Each result against ``reference`` (per prompt, indexed by layer id): shape and dtype,
    at most ``outliers`` of the tokens (at least ``min_outliers`` where any are allowed)
    over ``token_tolerance``, and a mean relative error under ``mean_tolerance`` over the
    other tokens. Returns the worst mean."""
    import torch

    import hf_reference

    worst = 0.0
    assert len(results) == len(prompts)
    for prompt, result, want in zip(prompts, results, reference, strict=True):
        states = result["hidden_states"]
        assert len(states) == len(layer_ids)
        for layer, got in zip(layer_ids, states, strict=True):
            assert got.shape == (len(prompt), hidden) and got.dtype == torch.bfloat16
            # Tokens past ``token_tolerance`` (MoE routing flips) are counted against
            # ``outliers``; the mean is over the rest, so one flip in a short prompt does
            # not decide it.
            kept = hf_reference.token_errors(got, want[layer]) <= token_tolerance
            off = int((~kept).sum())
            mean = (hf_reference.relative_errors(got[kept], want[layer][kept])[0]
                    if kept.any() else 0.0)
            allowed = max(min_outliers, outliers * len(prompt)) if outliers else 0
            assert mean < mean_tolerance and off <= allowed, (
                f"{label}layer {layer}, {len(prompt)} tokens: mean {mean:.2e}, "
                f"{off} tokens off")
            worst = max(worst, mean)
    return worst


@pytest.mark.parametrize("tp", [1, 2])
def test_llama_matches_hf(tiny_llama: Path, tp: int) -> None:
    import hf_reference

    if tp > gpu_count():
        pytest.skip(f"TP={tp} needs {tp} GPUs, {gpu_count()} visible")
    layer_ids = [0, 1, 2, 3]
    prompts = _prompts([5, 17, 300, 64, 1000])
    with speculators_generator(tiny_llama, layer_ids=layer_ids, tensor_parallel_size=tp,
                               gpu_memory_utilization=GPU_MEMORY) as gen:
        results = gen.generate(prompts)
    worst = _check(hf_reference.layer_outputs(tiny_llama, prompts), prompts, results,
                   layer_ids, 64)
    print(f"llama TP={tp}: worst mean relative error vs HF {worst:.2e}")


@pytest.mark.parametrize("tp", [1, 2])
def test_deepseek_mla_matches_hf(deepseek_mla: Path, tp: int) -> None:
    import hf_reference

    if tp > gpu_count():
        pytest.skip(f"TP={tp} needs {tp} GPUs, {gpu_count()} visible")
    layer_ids = [0, 2, 3]
    prompts = _prompts([5, 17, 300, 64])
    with speculators_generator(deepseek_mla, layer_ids=layer_ids, tensor_parallel_size=tp,
                               gpu_memory_utilization=GPU_MEMORY) as gen:
        results = gen.generate(prompts)
    worst = _check(hf_reference.layer_outputs(deepseek_mla, prompts), prompts, results,
                   layer_ids, 256, outliers=0.05)
    print(f"deepseek MLA TP={tp}: worst mean relative error vs HF {worst:.2e}")


# TP=2 splits each layer's matmuls and all-reduces the halves: the same function in bf16 up
# to summation order, so the bound is bf16 rounding noise, under the HF-parity bounds above
# (HF's own bf16 run differs from its fp32 run by up to 3.7e-2 mean on the tiny Llama).
# Seen on two H200s (worst over all prompts and layers): 2.19e-2 Llama, 2.21e-2 DeepSeek MLA.
TP_MEAN_TOLERANCE = 0.03
TP_TOKEN_TOLERANCE = 0.1


@pytest.mark.parametrize("model", ["llama", "deepseek_mla"])
def test_tp2_captures_what_tp1_captures(model: str, request: pytest.FixtureRequest) -> None:
    if gpu_count() < 2:
        pytest.skip(f"TP=2 needs 2 GPUs, {gpu_count()} visible")
    path = request.getfixturevalue("tiny_llama" if model == "llama" else "deepseek_mla")
    layer_ids, hidden = ([0, 1, 2, 3], 64) if model == "llama" else ([0, 2, 3], 256)
    prompts = _prompts([5, 17, 300, 64, 1000], seed=1)
    by_tp = {}
    for tp in (1, 2):
        with speculators_generator(path, layer_ids=layer_ids, tensor_parallel_size=tp,
                                   gpu_memory_utilization=GPU_MEMORY) as gen:
            by_tp[tp] = [{"hidden_states": [t.clone() for t in r["hidden_states"]]}
                         for r in gen.generate(prompts)]
    tp1 = [dict(zip(layer_ids, r["hidden_states"], strict=True)) for r in by_tp[1]]
    # MoE routing can flip on near-ties when the sums are reordered: DeepSeek may have a
    # few such tokens (one of 17 seen, layer 2), Llama none.
    worst = _check(tp1, prompts, by_tp[2], layer_ids, hidden,
                   outliers=0.0 if model == "llama" else 0.05, min_outliers=1,
                   mean_tolerance=TP_MEAN_TOLERANCE, token_tolerance=TP_TOKEN_TOLERANCE,
                   label=f"{model} TP=2 vs TP=1: ")
    print(f"{model}: TP=2 vs TP=1 worst mean relative difference {worst:.2e}")


VLLM_OWN_FORWARD = """
import sys, torch
from vllm import LLM, SamplingParams
model, out = sys.argv[1], sys.argv[2]
prompts = torch.load(out + ".prompts", weights_only=True)
llm = LLM(model=model, max_model_len=1024, enforce_eager=True, enable_prefix_caching=False,
          gpu_memory_utilization=0.2, moe_backend="triton")
net = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
calls = []
hooks = [layer.register_forward_hook(lambda m, a, o: calls.append((o[0] + o[1]).cpu()))
         for layer in net.model.layers]
states = []
for prompt in prompts:
    calls.clear()
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1), use_tqdm=False)
    states.append([c[: len(prompt)] for c in calls[: len(net.model.layers)]])
torch.save(states, out)
"""


def test_llama_4_scaling_is_vllms_own(deepseek_mla_llama4_scaling: Path, tmp_path: Path) -> None:
    """With MLA on, llama_4_scaling scales the queries; the capture must equal vLLM's own
    forward (one prompt at a time, in a separate process) and differ from HF's, which
    ignores the key, past position 16."""
    import torch

    import hf_reference

    layer_ids = [0, 3]
    prompts = _prompts([40, 200])
    out = tmp_path / "vllm_own.pt"
    torch.save(prompts, str(out) + ".prompts")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(VLLM_OWN_FORWARD),
                          str(deepseek_mla_llama4_scaling), str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    own = torch.load(out, weights_only=True)
    with speculators_generator(deepseek_mla_llama4_scaling, layer_ids=layer_ids,
                               gpu_memory_utilization=GPU_MEMORY) as gen:
        results = gen.generate(prompts)
    _check(own, prompts, results, layer_ids, 256, outliers=0.05)
    hf = hf_reference.layer_outputs(deepseek_mla_llama4_scaling, prompts)
    late = [hf_reference.relative_errors(results[1]["hidden_states"][1][16:], hf[1][3][16:])[0]]
    early = [hf_reference.relative_errors(results[1]["hidden_states"][1][:16], hf[1][3][:16])[0]]
    print(f"llama_4_scaling: vs HF before position 16 {early[0]:.2e}, after {late[0]:.2e}")
    assert early[0] < MEAN_TOLERANCE < late[0]


def test_kimi_k25_architecture(models_dir: Path) -> None:
    """Kimi-K2.5's layout around a language model with real MLA head shapes (the CUDA MLA
    kernels reject the CPU tests' tiny heads)."""
    import hf_reference
    import tiny_models
    from conftest import build_deepseek_mla

    text = build_deepseek_mla(models_dir / "kimi-k25-text-mla")
    model = tiny_models.build_kimi_k25(models_dir / "kimi-k25-mla", hidden=256, text_model=text)
    reference_model = tiny_models.kimi_text_reference(model)
    layer_ids = [0, 2, 3]
    prompts = _prompts([9, 120, 33])
    with speculators_generator(model, layer_ids=layer_ids,
                               gpu_memory_utilization=GPU_MEMORY) as gen:
        results = gen.generate(prompts)
    worst = _check(hf_reference.layer_outputs(reference_model, prompts), prompts, results,
                   layer_ids, 256, outliers=0.05)
    print(f"kimi-k25 architecture (MLA): worst mean relative error vs HF {worst:.2e}")


def test_real_kimi_k25_on_sm120() -> None:
    """Opt-in: SPECCOMPAT_KIMI_K25_PATH names a Kimi-K2.5 checkpoint; needs SM120 GPUs."""
    import torch

    path = os.environ.get("SPECCOMPAT_KIMI_K25_PATH")
    missing = []
    if not path:
        missing.append("SPECCOMPAT_KIMI_K25_PATH is not set")
    capability = torch.cuda.get_device_capability()
    if capability != (12, 0):
        missing.append(f"GPU compute capability is {capability[0]}.{capability[1]}, not 12.0")
    if missing:
        pytest.skip("; ".join(missing))

    layer_ids = [2, 30, 58, 60]
    prompts = _prompts([512, 77], seed=3)
    with speculators_generator(Path(str(path)), layer_ids=layer_ids,
                               tensor_parallel_size=gpu_count(), max_model_len=4096) as gen:
        results = gen.generate(prompts)
    for prompt, result in zip(prompts, results, strict=True):
        states = result["hidden_states"]
        assert len(states) == 4
        for state in states:
            assert state.shape == (len(prompt), 7168) and state.dtype == torch.bfloat16
            assert torch.isfinite(state).all()


def test_llama_on_model_runner_v2(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model Runner V2 (the default for Llama from vLLM 0.23.0, for all models from 0.29.0)
    has no input_batch and orders each step's requests itself (decodes, then by length):
    prompts given out of length order, one long enough to be chunked, must each get their
    own rows."""
    import hf_reference

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    layer_ids = [0, 1, 3]
    prompts = _prompts([300, 5, 3000, 17, 64, 1000], seed=5)
    with speculators_generator(tiny_llama, layer_ids=layer_ids, max_model_len=4096,
                               gpu_memory_utilization=GPU_MEMORY) as gen:
        # speculators 0.4.0 on vLLM >= 0.11.1 gets the executor itself, with no view over it.
        executor = getattr(gen.executor, "unwrapped", gen.executor)
        runner = executor.collective_rpc(
            lambda worker: type(worker.model_runner).__module__)
        assert runner == ["vllm.v1.worker.gpu.model_runner"], runner
        results = gen.generate(prompts)
        again = gen.generate(prompts[:2])
    worst = _check(hf_reference.layer_outputs(tiny_llama, prompts), prompts, results,
                   layer_ids, 64)
    _check(hf_reference.layer_outputs(tiny_llama, prompts[:2]), prompts[:2], again, layer_ids, 64)
    print(f"llama on Model Runner V2: worst mean relative error vs HF {worst:.2e}")


SPAWN_AFTER_CUDA = """
import sys, torch
sys.path.insert(0, {tests!r})
import speccompat
from vllm import envs
speccompat.apply(exclude={exclude!r})
torch.zeros(1, device="cuda")      # this process has touched CUDA...
envs.enable_envs_cache()           # ...and an engine ran here before (e.g. a benchmark)
from support import speculators_generator
import tiny_models
with speculators_generator(__import__("pathlib").Path({model!r}), apply=False, layer_ids=[1],
                           gpu_memory_utilization=0.2) as gen:
    out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12]))
    print("ROWS", out[0]["hidden_states"][0].shape[0])
"""


@pytest.mark.parametrize("excluded", [False, True], ids=["with", "without"])
def test_executor_after_cuda_init(tiny_llama: Path, excluded: bool) -> None:
    from speccompat.inprocess.adapters.spawn_after_cuda_init import ID

    tests = str(Path(__file__).resolve().parents[1])
    script = SPAWN_AFTER_CUDA.format(tests=tests, exclude=(ID,) if excluded else (),
                                     model=str(tiny_llama))
    # Unset: vLLM's default, fork, is what enable_envs_cache() caches.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    if excluded:
        assert run.returncode != 0
        assert "Cannot re-initialize CUDA in forked subprocess" in run.stdout + run.stderr
    else:
        assert run.returncode == 0, run.stderr[-4000:]
        assert "ROWS 12" in run.stdout
