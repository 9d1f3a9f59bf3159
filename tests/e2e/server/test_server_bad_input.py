"""Bad input on the server path (vLLM's CPU build, ``vllm serve`` with
``extract_hidden_states`` and the stock ``ExampleHiddenStatesConnector``): a prompt longer
than ``--max-model-len``, a ``kv_transfer_config`` without ``shared_storage_path``, a client
that disconnects right after sending, and a disk that fills up mid-write. Each must fail
that request alone, keep the server serving, and leave no partial file that looks complete
(``speccompat verify`` on the storage folder flags anything partial).

Ids out of range are in test_server_path.py; out-of-order ids in
tests/contract/server/test_extract_hidden_states_layer_ids.py."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import serving
from support import requires_speculators, requires_vllm, speculators_in

pytestmark = [requires_vllm, requires_speculators,
              speculators_in(">=0.5", "speculators before 0.5 has no server-path client")]

# --dtype float32 against HF float32, as in test_server_path.py.
FP32_BOUND = 1e-4
MAX_MODEL_LEN = 1024  # what serving.serve passes
# A small token budget with chunked prefill: a long prompt takes many engine steps, so a
# client that disconnects right after sending leaves while its prompt is being prefilled.
BUDGET = 32
SLOW_PREFILL = ("--dtype", "float32", "--enable-chunked-prefill",
                "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    return serving.llama_fp32(models_dir)


@pytest.fixture(scope="module")
def srv(llama_fp32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[serving.Server]:
    """One server for the per-request cases: ids 0..N, chunked prefill, 32-token budget."""
    serving.skip_unless_the_cpu_build_serves()
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    with serving.serve(llama_fp32, tmp_path_factory.mktemp("bad-input"), layer_ids,
                      *SLOW_PREFILL) as running:
        yield running


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _against_hf(states: object, model: Path, prompt: list[int]) -> float:
    """The worst max relative error of one request's ids (0..N) against HF float32."""
    import torch

    import hf_reference

    assert isinstance(states, torch.Tensor)
    want = hf_reference.layer_inputs(model, [prompt])[0]
    assert tuple(states.shape) == (len(prompt), len(want), want[0].shape[-1])
    worst = max(hf_reference.relative_errors(states[:, k], want[k])[1] for k in range(len(want)))
    assert worst < FP32_BOUND, f"{worst:.2e}"
    return worst


def _good_request(srv: serving.Server, model: Path, seed: int) -> float:
    """A normal request after the bad one: HTTP 200, its file complete and right."""
    prompt = serving.prompts((20,), seed=seed)[0]
    return _against_hf(serving.fetch_states(srv, prompt), model, prompt)


def _one_file_against_hf(path: Path, model: Path, prompt: list[int]) -> float:
    from safetensors.torch import load_file

    data = load_file(str(path))
    assert data["token_ids"].tolist() == prompt
    return _against_hf(data["hidden_states"], model, prompt)


def test_a_prompt_longer_than_max_model_len_is_refused(srv: serving.Server,
                                                       llama_fp32: Path) -> None:
    """HTTP 400 naming the context length, before the engine sees it: no file, no lock;
    the next request is served."""
    before = _files(srv.storage)
    status, body = srv.completion(serving.prompts((MAX_MODEL_LEN + 76,), seed=1)[0])
    assert status == 400, f"HTTP {status}: {body}"
    assert "context length" in str(body) or "max_model_len" in str(body), body
    assert _files(srv.storage) == before
    _good_request(srv, llama_fp32, seed=2)
    assert srv.alive()


def _send_and_close(srv: serving.Server, prompt: list[int]) -> None:
    """A client that sends a whole ``/v1/completions`` request and closes its socket at
    once, without reading the answer."""
    body = json.dumps({"model": str(srv.model), "prompt": prompt, "max_tokens": 1,
                       "return_token_ids": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(head + body)


def _settle(folder: Path, seconds: float = 20.0) -> set[str]:
    """The folder's names once they stopped changing for a few seconds."""
    deadline = time.monotonic() + seconds
    names = _files(folder)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1)
        now = _files(folder)
        if now != names:
            names, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 5:
            break
    return names


def test_a_client_that_disconnects_mid_request(srv: serving.Server, llama_fp32: Path,
                                               tmp_path: Path) -> None:
    """The prompt (1000 tokens, 32 per step) is still being prefilled when the client has
    gone; vLLM aborts the request. The server keeps serving, and whatever the aborted
    request left in the storage folder is either complete (equal to HF) or flagged."""
    prompt = serving.prompts((1000,), seed=4)[0]
    before = _files(srv.storage)
    _send_and_close(srv, prompt)
    left = _settle(srv.storage) - before
    worst = _good_request(srv, llama_fp32, seed=5)
    assert srv.alive()
    log = srv.log_text()
    files = sorted(name for name in left if name.endswith(".safetensors"))
    print(f"disconnect: left {sorted(left)}; next request worst {worst:.2e}")
    if not files:
        return
    # A file from the aborted request: complete and right, or flagged by verify.
    folder = tmp_path / "aborted"
    folder.mkdir()
    for name in files:
        os.link(srv.storage / name, folder / name)
    status, report = serving.verify_report(folder, llama_fp32)
    for name in files:
        try:
            _one_file_against_hf(folder / name, llama_fp32, prompt)
            complete = True
        except Exception as error:  # a torn file, wrong tokens or wrong values
            print(f"aborted request's {name}: {type(error).__name__}: {str(error)[:200]}")
            complete = False
        print(f"aborted request's {name}: complete={complete}, verify exit {status}")
        assert complete or status != 0, (name, report, log[-3000:])


def test_a_disk_that_fills_up_mid_write(llama_fp32: Path, tmp_path: Path) -> None:
    """Storage on a 2 MiB tmpfs, all but 256 KiB taken: a 1000-token request's file (1.28
    MB in float32) cannot be written. The server keeps serving once there is room again, and
    ``speccompat verify`` flags what the failed write left."""
    serving.skip_unless_the_cpu_build_serves()
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    with serving.tmpfs(tmp_path / "hs", "2m") as storage:
        free = os.statvfs(storage)
        filler = storage / "filler.bin"
        filler.write_bytes(b"\1" * (free.f_bavail * free.f_frsize - 256 * 1024))
        with serving.serve(llama_fp32, tmp_path, layer_ids, *SLOW_PREFILL) as srv:
            prompt = serving.prompts((1000,), seed=6)[0]
            status, body = srv.completion(prompt)
            assert status == 200, f"HTTP {status}: {body}"  # the write comes after the answer
            path = Path(body["kv_transfer_params"]["hidden_states_path"])
            serving.wait_until_written(path)  # the writer releases the lock on failure too
            deadline = time.monotonic() + 30
            while "Hidden-states write failed" not in srv.log_text():
                assert time.monotonic() < deadline, srv.log_tail()
                time.sleep(1)
            filler.unlink()
            worst = _good_request(srv, llama_fp32, seed=7)
            assert srv.alive()
            log = srv.log_text()
            left = sorted(p.name for p in storage.iterdir())
            size = path.stat().st_size if path.exists() else None
            status_code, report = serving.verify_report(storage, llama_fp32)
    failure = next(line for line in log.splitlines() if "Hidden-states write failed" in line)
    print(f"disk full: {failure.strip()[-200:]}; left {left}, partial size {size}; "
          f"next request worst {worst:.2e}; verify exit {status_code}")
    assert "No space left on device" in failure or "os error 28" in failure, failure
    if size is not None:  # a partial file at the path the client was given: flagged
        assert status_code != 0, report
        flagged = [f for f in report["files"] if not f["ok"]]
        assert [f["file"] for f in flagged] == [path.name], report


def test_a_kv_transfer_config_without_shared_storage_path(llama_fp32: Path,
                                                          tmp_path: Path) -> None:
    """vLLM's raw behaviour: no start-up error and no warning; the connector falls back to
    ``/tmp`` (its default, logged at INFO as "Shared storage path is /tmp") and every file
    and lock is written there, complete."""
    serving.skip_unless_the_cpu_build_serves()
    bare = json.dumps({"kv_connector": serving.CONNECTOR, "kv_role": "kv_producer"})
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    # The last --kv-transfer-config on the command line wins over serve()'s own.
    with serving.serve(llama_fp32, tmp_path, layer_ids, "--dtype", "float32",
                      "--kv-transfer-config", bare) as srv:
        status, body = srv.completion(serving.prompts((20,), seed=8)[0])
        assert status == 200, f"HTTP {status}: {body}\n{srv.log_tail()}"
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        try:
            serving.wait_until_written(path)
            worst = _one_file_against_hf(path, llama_fp32, serving.prompts((20,), seed=8)[0])
        finally:
            for done in (path, Path(f"{path}.lock")):
                done.unlink(missing_ok=True)
        log = srv.log_text()
    print(f"no shared_storage_path: wrote {path}; next request worst {worst:.2e}")
    assert path.parent == Path("/tmp"), path
    assert "Shared storage path is /tmp" in log, log[-4000:]
    assert not any(srv.storage.iterdir())
