"""The layer-id check and the slot order on CUDA, on whichever model runner the release runs
(Model Runner V2 from vLLM 0.29 by default, the only one in 0.34.0): a real ``vllm serve``
with ``extract_hidden_states`` and the stock connector, speccompat installed.

- An id past the last layer (``[1, N + 1]`` on an N-layer Llama) stops the server before
  any engine starts, with speccompat's ``LayerIdError`` in the log.
- Ids out of order and repeated (``[N, 1, 2, 1]``) give the slots ids 1, 2, N, each once in
  layer order, matching an HF float32 forward, in eager and compiled mode; the log says so.
- Without speccompat (``SPECCOMPAT_DISABLE=1``), what the release does with the repeated id.

Run on the GPU host: ``pytest tests/gpu/test_gpu_layer_ids.py``; ``SPECCOMPAT_GPU_LOGS``
names a folder for the servers' logs and ``layer-ids.txt`` (the figures).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import serving
from support import gpu_count, requires_vllm

pytestmark = [requires_vllm,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]
TOKEN_BOUND = 0.15  # bf16 on the GPU against HF float32 (test_gpu_server_path.py)
OUTLIER_SHARE = 0.01
# A fixed KV cache: concurrent servers skip vLLM's memory profiling, which fails ("Error in
# memory profiling") when another server frees GPU memory meanwhile (seen on 0.34.0).
GPU_ARGS = ("--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", "1073741824",
            "--max-num-seqs", "16")
REFUSAL = "speccompat refuses the extract_hidden_states layer ids: LayerIdError"


def _prompts() -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [9, 130], seed=17)


def _record(tmp_path: Path, name: str, lines: list[str]) -> None:
    print("\n".join(lines))
    if folder := os.environ.get("SPECCOMPAT_GPU_LOGS"):  # pytest-xdist keeps no output
        Path(folder).mkdir(parents=True, exist_ok=True)
        if (tmp_path / "server.log").exists():
            shutil.copy(tmp_path / "server.log", Path(folder) / f"layer-ids-{name}.log")
        with (Path(folder) / "layer-ids.txt").open("a") as out:
            out.write("\n".join(lines) + "\n")


def _runner(log: str) -> str:
    import vllm
    from packaging.version import Version

    if Version(vllm.__version__).release >= (0, 34):
        return "V2 (the only runner from 0.34.0)"
    return "V2" if "V2 Model Runner" in log or "Model Runner V2" in log else "V1"


def test_an_id_past_the_last_layer_stops_the_server(tiny_llama: Path, tmp_path: Path) -> None:
    n = serving.num_layers(tiny_llama)
    with pytest.raises(RuntimeError, match="exited"), \
            serving.serve(tiny_llama, tmp_path, [1, n + 1], *GPU_ARGS):
        pass
    log = (tmp_path / "server.log").read_text(errors="replace")
    _record(tmp_path, "refused", [f"refused [1, {n + 1}]: {REFUSAL in log}"])
    assert REFUSAL in log, log[-3000:]
    assert f"id {n + 1} (position 1) cannot be served" in log


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_unordered_and_repeated_ids_give_slots_in_layer_order(tiny_llama: Path, tmp_path: Path,
                                                              eager: bool) -> None:
    import hf_reference

    n = serving.num_layers(tiny_llama)
    asked, slots = [n, 1, 2, 1], [1, 2, n]
    prompts = _prompts()
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    with serving.serve(tiny_llama, tmp_path, asked, *GPU_ARGS, env=env, eager=eager) as srv:
        states = [serving.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_text()
    mode = "eager" if eager else "compiled"
    lines = [f"{mode}: runner {_runner(log)}; slot line: "
             f"{'the files hold slot 0 = id 1, slot 1 = id 2' in log}"]
    reference = hf_reference.layer_inputs(tiny_llama, prompts)
    for index, (got, want) in enumerate(zip(states, reference, strict=True)):
        assert tuple(got.shape)[:2] == (len(prompts[index]), len(slots))
        for slot, layer in enumerate(slots):
            errors = hf_reference.token_errors(got[:, slot], want[layer])
            share = float((errors > TOKEN_BOUND).float().mean())
            lines.append(f"{mode} prompt {index} slot {slot} (id {layer}): max "
                         f"{float(errors.max()):.3e}, share over {TOKEN_BOUND}: {share:.4f}")
            assert share <= OUTLIER_SHARE, lines[-1]
    _record(tmp_path, mode, lines)
    assert (f"eagle_aux_hidden_state_layer_ids {asked}: the files hold slot 0 = id 1, "
            f"slot 1 = id 2, slot 2 = id {n}") in log


def test_without_speccompat_a_repeated_id(tiny_llama: Path, tmp_path: Path) -> None:
    """The raw behaviour the slot order answers, recorded: vLLM sizes its buffers by the
    list (4 slots) while the model returns one state per distinct id (3)."""
    n = serving.num_layers(tiny_llama)
    prompt = _prompts()[0]
    try:
        with serving.serve(tiny_llama, tmp_path, [n, 1, 2, 1], *GPU_ARGS,
                           env={"SPECCOMPAT_DISABLE": "1"}) as srv:
            status, body = srv.completion(prompt, timeout=120)
            outcome = f"HTTP {status}"
            if status == 200:
                path = Path(body["kv_transfer_params"]["hidden_states_path"])
                try:
                    serving.wait_until_written(path, timeout=60)
                    from safetensors.torch import load_file

                    shape = tuple(load_file(str(path))["hidden_states"].shape)
                    outcome += f", file shape {shape}"
                except (AssertionError, TimeoutError) as error:
                    outcome += f", no file: {str(error)[:200]}"
            log = srv.log_text()
    except RuntimeError as error:
        # The runner is named in the server's log, not in the error's tail.
        server_log = tmp_path / "server.log"
        log = server_log.read_text(errors="replace") if server_log.exists() else ""
        outcome = f"refused at start-up: {str(error)[:300]}"
    errors = [line for line in log.splitlines() if "Error" in line][-3:]
    _record(tmp_path, "raw", [f"raw [n, 1, 2, 1] on {_runner(log)}: {outcome}", *errors])
    # Whatever it is, it is not 4 filled slots in the order asked.
    assert f"file shape ({len(prompt)}, 4," not in outcome, outcome
