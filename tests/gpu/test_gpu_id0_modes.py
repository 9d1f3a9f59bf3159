"""Id 0 (the embeddings) on CUDA in the modes users run: ``--enforce-eager`` and compiled
(CUDA graphs), bf16 and fp32, with speccompat and without its copy of id 0.

In eager mode the first decoder layer's in-place fused add-RMSNorm (``vllm_c``) updates the
tensor ``EagleModelMixin`` captured for id 0, so without ``vllm.eagle_mixin_capture_alias``
id 0's slot holds a later state (seen on vLLM 0.26.0: the final pre-norm state, digit for
digit). With it, id 0 is HF's embeddings bit for bit, in every mode. DeepSeek's id 0 comes
from ``deepseek_first_layer_residual`` (its own copy, ``aux_edges.with_first_id``); without
that adapter DeepSeek serves no id 0 at all, so it runs with speccompat only.

The configurations of one model run as concurrent servers (tiny models, a fixed KV cache
each). Run on the GPU host like test_gpu_server_path.py; ``SPECCOMPAT_GPU_LOGS`` keeps logs.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import serving
from speccompat.server.adapters.eagle_mixin_capture_alias import ID as MIXIN_COPY
from support import gpu_count, requires_vllm

pytestmark = [requires_vllm,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]
PROMPT_LENGTHS = (37, 5, 300, 129)  # the lengths of the first report (issue #34)
# Per token: the largest difference relative to the reference's largest magnitude. bf16 as in
# test_gpu_server_path.py; fp32 against HF fp32 was 5e-4 .. 1.4e-3 (Llama, vLLM 0.26.0).
TOKEN_BOUND = {"bfloat16": 0.15, "float32": 0.01}
OUTLIER_SHARE = 0.01
# Several servers at once: a fixed KV cache each instead of a share of the GPU's memory.
GPU_ARGS = ("--gpu-memory-utilization", "0.04", "--kv-cache-memory-bytes", str(1 << 30),
            "--max-num-seqs", "8")


@dataclass(frozen=True)
class Mode:
    eager: bool
    dtype: str
    speccompat: bool = True

    @property
    def name(self) -> str:
        return (f"{'eager' if self.eager else 'compiled'}-{self.dtype}"
                f"{'' if self.speccompat else f'-without-{MIXIN_COPY}'}")


WITH = [Mode(eager, dtype) for eager in (True, False) for dtype in ("bfloat16", "float32")]
WITHOUT = [Mode(eager, "float32", speccompat=False) for eager in (True, False)]


def _prompts() -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, list(PROMPT_LENGTHS), seed=21)


def _serve_and_fetch(model: Path, work: Path, mode: Mode, extra: tuple[str, ...],
                     fp32_env: dict[str, str]) -> Any:
    ids = list(range(serving.num_layers(model) + 1))
    env = {"VLLM_CACHE_ROOT": str(work / "vllm-cache")}
    if mode.dtype == "float32":
        env.update(fp32_env)
    if not mode.speccompat:
        env["SPECCOMPAT_SKIP"] = MIXIN_COPY
    try:
        with serving.serve(model, work, ids, "--dtype", mode.dtype, *GPU_ARGS, *extra,
                          env=env, eager=mode.eager) as srv:
            states = [serving.fetch_states(srv, prompt) for prompt in _prompts()]
            log = srv.log_text()
    finally:
        if folder := os.environ.get("SPECCOMPAT_GPU_LOGS"):
            Path(folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "server.log", Path(folder) / f"{model.name}-{mode.name}.log")
    return states, log


def _run(model: Path, tmp_path: Path, modes: list[Mode], *extra: str,
         fp32_env: dict[str, str] | None = None) -> dict[Mode, Any]:
    with ThreadPoolExecutor(max_workers=len(modes)) as pool:
        futures = {mode: pool.submit(_serve_and_fetch, model, tmp_path / mode.name, mode, extra,
                                     fp32_env or {})
                   for mode in modes}
        return {mode: future.result() for mode, future in futures.items()}


def _check(model: Path, runs: dict[Mode, Any]) -> list[str]:
    """Every run against HF fp32; returns the figures, asserting as each mode expects."""
    import hf_reference

    reference = hf_reference.layer_inputs(model, _prompts())
    ids = list(range(len(reference[0])))
    lines, failures = [], []
    for mode, (states, log) in runs.items():
        assert "server-path adapters applied" in log, f"{mode.name}: speccompat not applied"
        applied = log.split("server-path adapters applied")[1].splitlines()[0]
        assert (MIXIN_COPY in applied) is mode.speccompat, f"{mode.name}: {applied}"
        for index, (got, want) in enumerate(zip(states, reference, strict=True)):
            assert tuple(got.shape)[:2] == (len(want[0]), len(ids))
            first = got[:, 0].float()
            id0_ok = first.equal(want[0])
            same_as = [i for i in ids[1:] if got[:, i].equal(got[:, 0])]
            worst = []
            for slot in ids[1:]:
                errors = hf_reference.token_errors(got[:, slot], want[slot])
                share = float((errors > TOKEN_BOUND[mode.dtype]).float().mean())
                worst.append(f"{float(errors.max()):.2e}")
                if mode.speccompat and share > OUTLIER_SHARE:
                    failures.append(f"{mode.name} prompt {index} id {slot}: {share:.3f} of "
                                    f"tokens over {TOKEN_BOUND[mode.dtype]}")
            id0_error = float(hf_reference.token_errors(got[:, 0], want[0]).max())
            lines.append(f"{model.name} {mode.name} prompt {index} ({len(want[0])} tokens): "
                         f"id 0 {'bit-equal' if id0_ok else f'max {id0_error:.2e}'}"
                         f"{f', equal to slots {same_as}' if same_as else ''}; "
                         f"ids 1..{ids[-1]} max {', '.join(worst)}")
            if mode.speccompat and not id0_ok:
                failures.append(f"{mode.name} prompt {index}: id 0 is not the embeddings")
            if not mode.speccompat and mode.eager and id0_ok:
                failures.append(f"{mode.name} prompt {index}: id 0 is the embeddings without "
                                f"{MIXIN_COPY}: the aliasing did not happen on this release")
    print("\n".join(lines))
    if folder := os.environ.get("SPECCOMPAT_GPU_LOGS"):  # pytest-xdist keeps no output
        Path(folder).mkdir(parents=True, exist_ok=True)
        with (Path(folder) / "figures.txt").open("a") as figures:
            figures.write("\n".join(lines + failures) + "\n")
    assert not failures, "\n".join(failures)
    return lines


def _runner(log: str) -> str:
    return "V2" if "Using V2 Model Runner" in log else "V1"


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen3"])
def test_mixin_stacks_id_0_in_every_mode(fixture: str, request: pytest.FixtureRequest,
                                         tmp_path: Path) -> None:
    """Llama and Qwen3 (EagleModelMixin): with speccompat id 0 is the embeddings in eager
    and compiled mode, bf16 and fp32; without its copy, eager mode loses id 0."""
    model: Path = request.getfixturevalue(fixture)
    runs = _run(model, tmp_path, WITH + WITHOUT)
    _check(model, runs)
    print(f"{model.name} runner:", {m.name: _runner(log) for m, (_, log) in runs.items()})


@pytest.fixture(scope="module")
def deepseek_runs(deepseek_mla: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Mode, Any]:
    # No CUDA MLA backend takes float32 ("No valid attention backend found ... head_size=576,
    # dtype=torch.float32, use_mla=True", vLLM 0.26.0): fp32 runs the same weights unabsorbed.
    return _run(deepseek_mla, tmp_path_factory.mktemp("deepseek"), WITH, "--moe-backend",
                "triton", fp32_env={"VLLM_MLA_DISABLE": "1"})


@pytest.mark.xdist_group("deepseek")  # with pytest-xdist: one worker, one set of servers
def test_deepseek_mla_id_0_in_every_mode(deepseek_mla: Path,
                                         deepseek_runs: dict[Mode, Any]) -> None:
    _check(deepseek_mla, deepseek_runs)
    print("deepseek runner:", {m.name: _runner(log) for m, (_, log) in deepseek_runs.items()})


@pytest.mark.xdist_group("deepseek")
def test_deepseek_fp32_final_id_error_is_routing(deepseek_mla: Path,
                                                 deepseek_runs: dict[Mode, Any]) -> None:
    """Issue #34 item 4: fp32 DeepSeek-V3 (real MLA shapes) served id N 3.8e-2 away from HF
    fp32 on a 300-token prompt. HF fp32 on this GPU with TF32 off and on, against HF fp32 on
    the CPU, says what float reordering alone gives; the router's top-k margins (HF, on the
    GPU) say whether the tokens far off sit at a near-tie, where a rounding difference picks
    another expert."""
    import torch
    from transformers import AutoModelForCausalLM

    import hf_reference

    prompt = _prompts()[2]
    cpu = hf_reference.layer_inputs(deepseek_mla, [prompt])[0]
    model = AutoModelForCausalLM.from_pretrained(str(deepseek_mla), dtype=torch.float32).cuda()
    top_k = int(model.config.num_experts_per_tok)
    margins: list[Any] = []

    def router_margin(module: Any, args: Any) -> None:
        # The router's choice, computed from its input: sigmoid scores plus the bias.
        hidden = args[0].reshape(-1, module.weight.shape[-1]).float()
        scores = torch.nn.functional.linear(hidden, module.weight.float()).sigmoid()
        top = (scores + module.e_score_correction_bias.float()).topk(top_k + 1, dim=-1).values
        margins.append((top[:, -2] - top[:, -1]).cpu())

    gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    assert gates, "no MoE router found"
    figures, gpu_margins = {}, None
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        margins.clear()
        handles = [gate.register_forward_pre_hook(router_margin) for gate in gates]
        try:
            with torch.no_grad():
                out = model(input_ids=torch.tensor([prompt]).cuda(), use_cache=False,
                            output_hidden_states=True)
        finally:
            for handle in handles:
                handle.remove()
        states = [h[0].float().cpu() for h in out.hidden_states]
        figures[tf32] = [float(hf_reference.token_errors(states[i], cpu[i]).max())
                         for i in range(1, len(cpu) - 1)]
        if not tf32:
            gpu_margins = torch.stack(margins).amin(dim=0)  # per token, smallest over layers
    torch.backends.cuda.matmul.allow_tf32 = False
    assert gpu_margins is not None
    states, _ = deepseek_runs[Mode(True, "float32")]
    got = states[2]
    errors = hf_reference.token_errors(got[:, -1], cpu[-1])
    far = (errors > TOKEN_BOUND["float32"]).nonzero().flatten().tolist()
    near_tie = float(gpu_margins.float().quantile(0.05))
    analysis = json.dumps({
        "hf_cuda_vs_cpu_fp32_tf32_off_ids_1_to_n-1": figures[False],
        "hf_cuda_vs_cpu_fp32_tf32_on_ids_1_to_n-1": figures[True],
        "vllm_fp32_eager_id_n_max": float(errors.max()),
        "vllm_fp32_eager_id_n_per_token_top5": errors.topk(5).values.tolist(),
        "tokens_over_bound": far,
        "their_smallest_router_margin": [float(gpu_margins[t]) for t in far],
        "router_margin_5th_percentile_all_tokens": near_tie}, indent=1)
    print(analysis)
    if folder := os.environ.get("SPECCOMPAT_GPU_LOGS"):
        (Path(folder) / "deepseek-fp32-routing.json").write_text(analysis)
    # The tokens far off are few, and each sits at a router near-tie (a margin in the lowest
    # 5% of all tokens'): routing, not the capture, which serves every other token closely.
    assert len(far) <= 0.02 * len(prompt), far
    assert all(float(gpu_margins[t]) <= near_tie for t in far), far
