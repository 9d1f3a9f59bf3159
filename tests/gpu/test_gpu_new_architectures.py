"""vLLM 0.34.0's new stacks on CUDA (speccompat issue #35, item 5): Kimi-K3
(``KimiK3ForConditionalGeneration``, KDA + MLA hybrid with attention residuals, under
``vllm/models/kimi_k3/``) and DeepSeek-V4 (``DeepseekV4ForCausalLM``, mHC residual streams,
sparse/compressed MLA, under ``vllm/models/deepseek_v4/``), both ``SupportsEagle3``.

The question: does a real ``vllm serve`` with ``extract_hidden_states`` and the stock
``ExampleHiddenStatesConnector`` serve every id speccompat accepts for them (0..N, N =
``num_hidden_layers``), in eager and in compiled mode, with every row of every slot written, and
are the values what the model's capture defines? Neither model has an HF transformers
implementation to compare with, so the reference is vLLM's own forward in a process of its own
(``tests/gpu/vllm_aux_oracle.py``: an eager ``vllm.LLM`` on the same bf16 weights with hooks on
the decoder layers that compute each id from the layers' own inputs and outputs), and, in that
process, the model's own capture compared with the hooks.

Tiny random-weight models (``tests/tiny_models.py``: ``write_tiny_kimi_k3``,
``write_tiny_deepseek_v4``) with the real layer structure and the shapes the CUDA kernels take.
Where a server or the reference cannot start, the test fails with the kernel, package or check
named from the log. Backends: ``--moe-backend triton`` (FlashInfer's MoE kernels are not usable
on the test host), bf16, vLLM's default attention backends on SM90 (FlashAttention MLA and
FlashKDA for Kimi-K3, FlashMLA sparse with the fp8_ds_mla KV cache for DeepSeek-V4).

Run on the GPU host: ``pytest tests/gpu/test_gpu_new_architectures.py -v -rs``;
``SPECCOMPAT_GPU_LOGS`` names a folder for the servers' and the reference's logs and
``new-architectures.txt`` (the figures).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import serving
from support import adapter_applies, gpu_count, requires_vllm, run_python, vllm_in

pytestmark = [requires_vllm,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU"),
              vllm_in(">=0.34.0", "the Kimi-K3 and DeepSeek-V4 stacks came with vLLM 0.34.0")]

TOKEN_BOUND = 0.15  # bf16 on the GPU (test_gpu_server_path.py); here both sides are vLLM bf16
OUTLIER_SHARE = 0.01  # tokens past the bound (MoE routing flips), at least one allowed
PROMPT_LENGTHS = (9, 130)
# A fixed KV cache: concurrent servers skip vLLM's memory profiling (test_gpu_layer_ids.py).
GPU_ARGS = ("--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", "1073741824",
            "--max-num-seqs", "16", "--dtype", "bfloat16", "--moe-backend", "triton")
ENGINE = {"dtype": "bfloat16", "max_model_len": 1024, "gpu_memory_utilization": 0.2,
          "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 16, "moe_backend": "triton"}
ORACLE = Path(__file__).with_name("vllm_aux_oracle.py")
ORACLE_SECONDS = 1500
STREAM_ENV = "VLLM_KIMI_K3_AUX_ATTN_RES_STREAM"
# Copies id 0 on KimiLinearModel without attention residuals (applied in every server here).
KIMI_COPY = "vllm.kimi_linear_first_layer_alias"


def _kimi_k3(path: Path) -> Path:
    import tiny_models

    return tiny_models.write_tiny_kimi_k3(path)


def _kimi_k3_no_attn_res(path: Path) -> Path:
    import tiny_models

    return tiny_models.write_tiny_kimi_k3(path, attn_res_block_size=None)


def _deepseek_v4(path: Path) -> Path:
    import tiny_models

    return tiny_models.write_tiny_deepseek_v4(path)


def _deepseek_v4_swa(path: Path) -> Path:
    import tiny_models

    return tiny_models.write_tiny_deepseek_v4(path, layer_types=("sliding_attention",) * 4)


@dataclass(frozen=True)
class Case:
    arch: str  # the oracle's hook set
    architecture: str  # config.json's architectures[0]
    build: Callable[[Path], Path]
    serve_args: tuple[str, ...] = ()
    engine: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for its servers and its reference


# Kimi-K3 is served text-only: with no image allowed vLLM builds no vision tower. Its GEMM-AR
# (VLLM_KIMI_K3_GEMM_AR, on by default) imports the CUTLASS DSL (`cutlass`) when the model is
# built, though it runs only on SM100 with TP > 1: off here, so a host without
# nvidia-cutlass-dsl still answers (a single SM90 GPU computes the same either way).
_TEXT_ONLY = {"limit_mm_per_prompt": {"image": 0}}
CASES = {
    "kimi_k3": Case("kimi_k3", "KimiK3ForConditionalGeneration", _kimi_k3,
                    ("--limit-mm-per-prompt", json.dumps(_TEXT_ONLY["limit_mm_per_prompt"])),
                    _TEXT_ONLY, {"VLLM_KIMI_K3_GEMM_AR": "0"}),
    # Without attention residuals KimiLinearModel (Kimi-Linear's stack too) appends id 0 as the
    # embeddings tensor itself, which its first layer then takes as its residual and adds into
    # in place: speccompat's kimi_linear_first_layer_alias gives that layer a copy, and the
    # layer-id check serves id 0 where it is applied (refused where it is skipped).
    "kimi_k3_no_attn_res": Case("kimi_k3", "KimiK3ForConditionalGeneration",
                                _kimi_k3_no_attn_res, (
                                    "--limit-mm-per-prompt",
                                    json.dumps(_TEXT_ONLY["limit_mm_per_prompt"])),
                                _TEXT_ONLY, {"VLLM_KIMI_K3_GEMM_AR": "0"}),
    "deepseek_v4": Case("deepseek_v4", "DeepseekV4ForCausalLM", _deepseek_v4),
    # Sliding-window layers only: no compressor (CuTe DSL on CUDA) and no Lightning Indexer
    # (DeepGEMM), to tell those kernels apart from the rest when the full model fails.
    "deepseek_v4_swa": Case("deepseek_v4", "DeepseekV4ForCausalLM", _deepseek_v4_swa),
}

# What a failed start says, first match first: (pattern, what it means).
_CAUSES: tuple[tuple[str, str], ...] = (
    (r"The `mlp_layer_types` entries must be in[^\n]*",
     "not a kernel: vLLM builds ExtractHiddenStatesConfig(<target config>, ...) as a plain "
     "PreTrainedConfig, whose validate_layer_type rejects DeepSeek-V4's mlp_layer_types "
     "('hash_moe', 'moe')"),
    (r"The `layer_types` entries must be in[^\n]*",
     "not a kernel: ExtractHiddenStatesConfig's layer_types validation"),
    (r"LayerIdError[^\n]*", "speccompat refused the layer ids"),
    (r"Expected \d+ auxiliary hidden states, got \d+",
     "the model returned fewer aux states than ids asked"),
    (r"tilelang is required[^\n]*", "TileLang (DeepSeek-V4's mHC kernels) is not installed"),
    (r"Sparse Attention Indexer CUDA op requires DeepGEMM[^\n]*",
     "DeepGEMM (DeepSeek-V4's Lightning Indexer)"),
    (r"No module named '([\w.]+)'[^\n]*", "a Python package is missing"),
    (r"[^\n]*nvcc[^\n]*(?:not found|No such file|missing|CUDA_HOME)[^\n]*",
     "nvcc, which TileLang / DeepGEMM JIT-compile their kernels with"),
    (r"[^\n]*CUDA_HOME[^\n]*", "no CUDA toolkit found for a JIT compiler"),
    (r"vllm\._flashmla(?:_extension)?_C is not available[^\n]*", "FlashMLA (vllm._flashmla_C)"),
    (r"FlashMLA[^\n]*(?:not supported|only supported)[^\n]*", "FlashMLA"),
    (r"FlashKDA requires[^\n]*", "FlashKDA (vllm._flashkda_C)"),
    (r"[^\n]*no kernel image is available for execution on the device[^\n]*",
     "a CUDA kernel not built for this GPU"),
    (r"[^\n]*(?:tilelang|TileLang|tvm)[^\n]*(?:Error|error|failed)[^\n]*", "TileLang"),
    (r"[^\n]*(?:DeepGEMM|deep_gemm)[^\n]*(?:Error|error|failed)[^\n]*", "DeepGEMM"),
    (r"[^\n]*(?:cutlass|CuTe|cute_dsl)[^\n]*(?:Error|error|failed)[^\n]*", "CUTLASS / CuTe DSL"),
    (r"[^\n]*(?:flashinfer|FlashInfer)[^\n]*(?:Error|error|failed)[^\n]*", "FlashInfer"),
    (r"[^\n]*triton[^\n]*(?:Error|error)[^\n]*", "a Triton kernel"),
)
# Lines worth keeping from a log: backend choices, the capture mode, speccompat's own lines.
_FACT_LINE = re.compile(r"backend|Backend|KDA|FlashKDA|FlashMLA|DeepGEMM|TileLang|tilelang|"
                        r"aux hidden capture|fp8_ds_mla|speccompat")


def diagnose(log: str) -> str:
    """The known causes of a failed start found in ``log`` (at most three, in ``_CAUSES``
    order, each with its line), then the last error line."""
    found: list[str] = []
    lines: set[str] = set()
    for pattern, what in _CAUSES:
        match = re.search(pattern, log)
        if match and len(found) < 3 and match.group(0).strip() not in lines:
            lines.add(match.group(0).strip())
            found.append(f"{what}: {match.group(0).strip()[:300]}")
    errors = [line for line in log.splitlines() if "Error" in line or "error" in line]
    last = errors[-1].strip()[:300] if errors else log[-300:]
    return "; ".join([*found, f"last error line: {last}"])


def _facts(log: str, limit: int = 12) -> list[str]:
    seen: list[str] = []
    for line in log.splitlines():
        text = line.split("]", 1)[-1].strip()
        if _FACT_LINE.search(line) and text not in seen:
            seen.append(text[:240])
        if len(seen) >= limit:
            break
    return seen


def _keep(path: Path, name: str) -> None:
    if (folder := os.environ.get("SPECCOMPAT_GPU_LOGS")) and path.exists():
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / f"new-arch-{name}.log")


def _record(lines: list[str]) -> None:
    print("\n".join(lines))
    if folder := os.environ.get("SPECCOMPAT_GPU_LOGS"):  # pytest-xdist keeps no output
        Path(folder).mkdir(parents=True, exist_ok=True)
        with (Path(folder) / "new-architectures.txt").open("a") as out:
            out.write("\n".join(lines) + "\n")


def _prompts() -> list[list[int]]:
    import tiny_models

    # Below the media tokens Kimi-K3's tokenizer keeps at the end of the vocabulary.
    words = tiny_models.VOCAB_SIZE - len(tiny_models.KIMI_MEDIA_TOKENS)
    return tiny_models.make_prompts(words, list(PROMPT_LENGTHS), seed=17)


def _num_layers(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    return int(config.get("text_config", config)["num_hidden_layers"])


def _served_ids(case: Case, n: int, model: Path) -> list[int]:
    """Every id speccompat accepts for the model inside a server here, as its start-up check
    decides (vLLM's ``get_eagle3_aux_layers_from_config`` takes any list unchecked)."""
    import vllm

    from speccompat.server.servable import servable_aux_ids

    first = adapter_applies("vllm.deepseek_first_layer_residual")[0]
    final = adapter_applies("vllm.deepseek_final_layer_capture")[0]
    kimi_copy = adapter_applies(KIMI_COPY)[0]
    # The fields the rule reads (Kimi's attn_res_block_size under text_config), from the
    # file: transformers has no class for these model types.
    raw = json.loads((model / "config.json").read_text())
    text = SimpleNamespace(**raw.get("text_config", raw))
    config = SimpleNamespace(**{**raw, "text_config": text})
    ids = servable_aux_ids(case.architecture, n, vllm.__version__, first_id_repaired=first,
                           final_id_repaired=final, kimi_first_id_copied=kimi_copy,
                           config=config)
    return list(range(ids.low, ids.high + 1))


_BUILT: dict[str, Path] = {}
_ORACLES: dict[str, dict[str, Any]] = {}
_ORACLE_FAILED: dict[str, str] = {}  # a reference that did not run is not run again


def _model(name: str, models_dir: Path) -> Path:
    if name not in _BUILT:
        _BUILT[name] = CASES[name].build(models_dir / f"new-arch-{name}")
    return _BUILT[name]


def _oracle(name: str, models_dir: Path) -> dict[str, Any]:
    """The reference run for model ``name`` (once per session): vllm_aux_oracle.py's output."""
    if name in _ORACLES:
        return _ORACLES[name]
    if name in _ORACLE_FAILED:
        pytest.fail(_ORACLE_FAILED[name])
    import torch

    case, model = CASES[name], _model(name, models_dir)
    work = models_dir / f"oracle-{name}"
    work.mkdir(parents=True, exist_ok=True)
    request = {"model": str(model), "arch": case.arch, "prompts": _prompts(),
               "aux_ids": list(range(_num_layers(model) + 1)),
               "engine": {**ENGINE, **case.engine}}
    (work / "request.json").write_text(json.dumps(request))
    out = work / "oracle.pt"
    env = {"VLLM_CACHE_ROOT": str(work / "vllm-cache"), **case.env}
    run = run_python(str(ORACLE), str(work / "request.json"), str(out), env=env,
                     timeout=ORACLE_SECONDS)
    (work / "oracle.log").write_text(run.stdout + run.stderr)
    _keep(work / "oracle.log", f"oracle-{name}")
    if run.returncode != 0 or not out.exists():
        text = run.stdout + run.stderr
        _ORACLE_FAILED[name] = (f"{name}: the reference vllm.LLM did not run "
                                f"({run.returncode}): {diagnose(text)}\n{text[-3000:]}")
        pytest.fail(_ORACLE_FAILED[name])
    _ORACLES[name] = torch.load(out, weights_only=False)
    return _ORACLES[name]


def _serve(name: str, model: Path, tmp_path: Path, ids: list[int], *, eager: bool,
           env: dict[str, str], tag: str = "") -> tuple[list[Any], str]:
    """Each prompt through a real server with ``ids``; (per prompt the file's hidden_states,
    the server's log). A server that does not start fails the test with the cause named."""
    label = f"{name} {'eager' if eager else 'compiled'}{tag}"
    try:
        with serving.serve(model, tmp_path, ids, *GPU_ARGS, *CASES[name].serve_args,
                           env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                                **CASES[name].env, **env},
                           eager=eager) as srv:
            states = []
            for prompt in _prompts():
                status, body = srv.completion(prompt)
                if status != 200:
                    log = serving.wait_for_engine_death(srv, 30)
                    pytest.fail(f"{label}: HTTP {status} for a {len(prompt)}-token prompt: "
                                f"{diagnose(log)}\n{str(body)[:1000]}")
                path = Path(body["kv_transfer_params"]["hidden_states_path"])
                serving.wait_until_written(path)
                from safetensors.torch import load_file

                data = load_file(str(path))
                assert data["token_ids"].tolist() == prompt, label
                states.append(data["hidden_states"])
            assert srv.alive(), srv.log_tail()
            log = srv.log_text()
    except (RuntimeError, TimeoutError) as error:  # it exited (or hung) before it was ready
        text = (tmp_path / "server.log").read_text(errors="replace")
        pytest.fail(f"{label}: vllm serve did not start with ids {ids}: {diagnose(text)}\n"
                    f"{str(error)[-2000:]}")
    finally:
        _keep(tmp_path / "server.log", label.replace(" ", "-"))
    return states, log


def _compare(label: str, states: list[Any], reference: list[dict[str, Any]], ids: list[int],
             kind: str) -> tuple[list[str], list[str]]:
    """Every file against the reference's ``kind`` ("default": the model's capture as vLLM
    defines it; "layer_input": each layer's pre-norm input). (lines, problems)."""
    import hf_reference

    lines: list[str] = []
    problems: list[str] = []
    for prompt, got, result in zip(_prompts(), states, reference, strict=True):
        want = result[kind] or result["default"]
        hidden = want[max(want)].shape[-1]
        where = f"{label} {len(prompt)}-token prompt"
        if tuple(got.shape) != (len(prompt), len(ids), hidden):
            problems.append(f"{where}: file shape {tuple(got.shape)}, expected "
                            f"{(len(prompt), len(ids), hidden)}")
            continue
        zero = (got == 0).all(dim=-1)  # [tokens, slots]
        if bool(zero.any()):
            problems.append(f"{where}: {int(zero.sum())} all-zero rows in slots "
                            f"{sorted(set(zero.nonzero()[:, 1].tolist()))}")
        for a in range(len(ids)):
            for b in range(a + 1, len(ids)):
                if got[:, a].equal(got[:, b]):
                    problems.append(f"{where}: slots {a} and {b} (ids {ids[a]}, {ids[b]}) equal")
        for slot, layer in enumerate(ids):
            if layer not in want:
                problems.append(f"{where}: the reference has no id {layer}")
                continue
            errors = hf_reference.token_errors(got[:, slot], want[layer])
            off = int((errors > TOKEN_BOUND).sum())
            lines.append(f"{where} id {layer} vs {kind}: max {float(errors.max()):.3e}, tokens "
                         f"over {TOKEN_BOUND}: {off}")
            if off > max(1, int(OUTLIER_SHARE * len(prompt))):
                problems.append(lines[-1])
        if 0 in ids and 0 in want and not got[:, ids.index(0)].equal(want[0]):
            problems.append(f"{where}: id 0 is not the embeddings bit for bit")
    return lines, problems


def _semantics(label: str, states: list[Any], reference: list[dict[str, Any]],
               ids: list[int]) -> list[str]:
    """For the record: each slot against the layer's pre-norm input (where the reference has
    one: Kimi-K3), and id N against the final pre-norm state (Kimi-K3: the stack's returned
    state; DeepSeek-V4: the input of its final norm, after ``hc_head`` collapses the streams)."""
    import hf_reference

    lines = []
    for prompt, got, result in zip(_prompts(), states, reference, strict=True):
        inputs, n = result["layer_input"], max(result["default"])
        final = result.get("final_prenorm", result["final"])
        where = f"{label} {len(prompt)}-token prompt"
        for slot, layer in enumerate(ids):
            if layer in inputs:
                errors = hf_reference.token_errors(got[:, slot], inputs[layer])
                lines.append(f"{where} id {layer} vs the layer's pre-norm input: max "
                             f"{float(errors.max()):.3e}")
        if n in ids:
            errors = hf_reference.token_errors(got[:, ids.index(n)], final)
            lines.append(f"{where} id {n} vs the final pre-norm state: max "
                         f"{float(errors.max()):.3e}")
    return lines


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["kimi_k3", "kimi_k3_no_attn_res", "deepseek_v4"])
def test_serve_every_id(name: str, eager: bool, models_dir: Path, tmp_path: Path) -> None:
    """Ids 0..N as speccompat accepts them, the stock connector, two prompts: every file whole,
    no zero row, no slot a copy of another, each slot the model's own capture (the reference's
    ``default``), id 0 the embeddings bit for bit. Kimi-K3 with attention residuals off
    (``kimi_k3_no_attn_res``, Kimi-Linear's path) serves id 0 through speccompat's
    ``kimi_linear_first_layer_alias``: without it its first layer adds into the captured
    embeddings (the reference process, which runs vLLM alone, shows that:
    ``test_in_process_capture_matches_the_layers[kimi_k3_no_attn_res]``)."""
    case, model = CASES[name], _model(name, models_dir)
    n = _num_layers(model)
    ids = _served_ids(case, n, model)
    if case.arch == "kimi_k3":
        assert ids == list(range(n + 1)), f"{name}: speccompat serves ids {ids}, not 0..{n}"
    mode = "eager" if eager else "compiled"
    states, log = _serve(name, model, tmp_path, ids, eager=eager, env={})
    reference = _oracle(name, models_dir)["results"]
    label = f"{name} {mode}"
    lines, problems = _compare(label, states, reference, ids, "default")
    lines += _semantics(label, states, reference, ids)
    lines += [f"{label} log: {fact}" for fact in _facts(log)]
    _record([f"{label}: ids {ids} (N = {n})", *lines, *[f"PROBLEM {p}" for p in problems]])
    assert "server-path adapters applied" in log
    if case.arch == "kimi_k3":
        applied = re.search(r"server-path adapters applied: ([^\n]*)", log)
        assert applied is not None and KIMI_COPY in applied.group(1), log[-3000:]
    assert not problems, "\n".join(problems)


def test_kimi_linear_style_id_0_without_the_copy_stops_the_server(models_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Kimi-K3 with attention residuals off (Kimi-Linear's path through ``KimiLinearModel``)
    and speccompat's copy of id 0 skipped (``SPECCOMPAT_SKIP=vllm.kimi_linear_first_layer_alias``):
    asked for id 0 the server stops at start-up with speccompat's ``LayerIdError``, which
    names the cause and the ids that are served (1..N); with the copy, test_serve_every_id
    serves 0..N."""
    name = "kimi_k3_no_attn_res"
    model = _model(name, models_dir)
    n = _num_layers(model)
    try:
        with pytest.raises(RuntimeError, match="exited"), \
                serving.serve(model, tmp_path, [0, 1, n], *GPU_ARGS, *CASES[name].serve_args,
                              env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                                   **CASES[name].env, "SPECCOMPAT_SKIP": KIMI_COPY}):
            pass
    finally:
        _keep(tmp_path / "server.log", f"{name}-id0-refused-without-the-copy")
    log = (tmp_path / "server.log").read_text(errors="replace")
    refused = "speccompat refuses the extract_hidden_states layer ids: LayerIdError" in log
    _record([f"{name} ids [0, 1, {n}], {KIMI_COPY} skipped: server stopped with LayerIdError: "
             f"{refused}; names the in-place update: {'in-place update' in log}"])
    assert refused, log[-3000:]
    assert "in-place update instead of the embeddings" in log, log[-3000:]


def test_kimi_k3_stream_mode_serves_layer_inputs(models_dir: Path, tmp_path: Path) -> None:
    """With ``VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1`` Kimi-K3's capture is the AttnRes mix each
    layer reads, before its norm: id k the input of layer k, id N the final pre-norm state
    (speccompat's convention). By default vLLM 0.34.0 captures the block's partial sum
    instead (test_serve_every_id records how far that is from the layers' inputs)."""
    name = "kimi_k3"
    model = _model(name, models_dir)
    n = _num_layers(model)
    ids = _served_ids(CASES[name], n, model)
    states, log = _serve(name, model, tmp_path, ids, eager=True, env={STREAM_ENV: "1"},
                         tag="-stream")
    reference = _oracle(name, models_dir)["results"]
    label = f"{name} eager {STREAM_ENV}=1"
    lines, problems = _compare(label, states, reference, ids, "layer_input")
    import hf_reference

    for prompt, got, result in zip(_prompts(), states, reference, strict=True):
        errors = hf_reference.token_errors(got[:, ids.index(n)], result["final"])
        off = int((errors > TOKEN_BOUND).sum())
        lines.append(f"{label} {len(prompt)}-token prompt id {n} vs the final pre-norm state: "
                     f"max {float(errors.max()):.3e}, tokens over {TOKEN_BOUND}: {off}")
        if off > max(1, int(OUTLIER_SHARE * len(prompt))):
            problems.append(lines[-1])
    lines += [f"{label} log: {fact}" for fact in _facts(log)]
    _record([f"{label}: ids {ids}", *lines, *[f"PROBLEM {p}" for p in problems]])
    assert "mode=attn_res_stream" in log, "the server did not log Kimi-K3's stream capture mode"
    assert not problems, "\n".join(problems)


# Stacks whose own id-0 capture vLLM 0.34.0 updates in place (vllm.kimi_linear_first_layer_alias).
ALIASED_FIRST_ID = {"kimi_k3_no_attn_res"}


@pytest.mark.parametrize("name", ["kimi_k3", "kimi_k3_no_attn_res", "deepseek_v4",
                                  "deepseek_v4_swa"])
def test_in_process_capture_matches_the_layers(name: str, models_dir: Path) -> None:
    """No server: in the reference process the model's own capture (its
    ``(hidden_states, aux_hidden_states)`` with ids 0..N set on the stack) against the hooks'
    values from the same forward, bit for bit; which ids it returns; every parameter loaded.
    This is the answer for DeepSeek-V4 where its server cannot start, and it says whether its
    kernels run on this GPU at all (``deepseek_v4_swa``: without the compressor and the
    indexer). Eager, as an ``--enforce-eager`` server runs: where the model appends a tensor a
    later layer updates in place (``kimi_k3_no_attn_res``, id 0), its capture differs from the
    hook's copy, and the test requires that it still does (the reference is vLLM alone)."""
    data = _oracle(name, models_dir)
    n = len(data["request"]["aux_ids"]) - 1
    facts = data["facts"]
    lines = [f"{name} in-process: vLLM {facts['vllm']}, {facts['gpu']} sm_"
             f"{''.join(map(str, facts['capability']))}, nvcc {facts['nvcc']}, "
             f"CUDA_HOME {facts['CUDA_HOME']}, modules {facts['modules']}; {data['stack']}"]
    problems = [f"parameter not loaded? {p}" for p in data["suspicious"]]
    # Which ids the stack captures (read from vllm/models/*/nvidia/model.py, 0.34.0):
    # Kimi-K3 all of 0..N, DeepSeek-V4 only those after a layer (1..N).
    captures = list(range(n + 1)) if CASES[name].arch == "kimi_k3" else list(range(1, n + 1))
    for prompt, result in zip(_prompts(), data["results"], strict=True):
        where = f"{name} {len(prompt)}-token prompt"
        captured, default = result["captured"], result["default"]
        lines.append(f"{where}: the stack returned {len(captured)} states for ids 0..{n}")
        if len(captured) != len(captures):
            problems.append(f"{where}: {len(captured)} states for ids 0..{n}, expected "
                            f"{len(captures)} (ids {captures})")
            continue
        for state, layer in zip(captured, captures, strict=True):
            diff = float((state.float() - default[layer].float()).abs().max())
            lines.append(f"{where} id {layer}: model capture vs hooks max |diff| {diff:.3e}")
            if name in ALIASED_FIRST_ID and layer == 0:
                # vLLM alone (the reference runs without speccompat): the first layer adds
                # into the captured embeddings; the day this is 0, vLLM copies id 0 itself
                # and vllm.kimi_linear_first_layer_alias can go.
                if diff == 0.0:
                    problems.append(f"{where}: id 0 is no longer updated in place by vLLM")
            elif diff != 0.0:
                problems.append(lines[-1])
        zero = [layer for state, layer in zip(captured, captures, strict=True)
                if bool((state == 0).all(dim=-1).any())]
        if zero:
            problems.append(f"{where}: all-zero rows in the capture of ids {zero}")
        final = result.get("final_prenorm", result["final"])
        last = captured[-1].float()
        rel = float((last - final.float()).abs().max() / final.float().abs().max())
        lines.append(f"{where}: id {n} vs the final pre-norm state: max rel {rel:.3e}")
        if result["layer_input"]:
            for layer in range(n + 1):
                gap = float((default[layer].float() - result["layer_input"][layer].float())
                            .abs().max() / result["layer_input"][layer].float().abs().max())
                lines.append(f"{where} id {layer}: default capture vs the layer's pre-norm "
                             f"input: max rel {gap:.3e}")
    _record([*lines, *[f"PROBLEM {p}" for p in problems]])
    assert not problems, "\n".join(problems)
