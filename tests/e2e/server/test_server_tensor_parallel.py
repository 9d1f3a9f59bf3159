"""The server path at ``--tensor-parallel-size 2`` on vLLM's CPU build (two worker
processes): the tiny Llama in float32 with ids 0..N, speculators' own
``generate-offline-data`` CLI as the client (concurrency 2, two batches on one server),
``speccompat verify`` on what it wrote, every id against HF float32, and each request's file
written once, by one rank.

What vLLM's ``ExampleHiddenStatesConnector`` does under TP: from 0.26.0 (and on 0.32.0) only
TP rank 0 creates the ``.lock`` and writes the file (``_is_tp_rank_zero``, set in
``register_kv_caches``); the other ranks no-op. 0.22.0's connector has no such check: every
rank opens ``<path>.lock`` (``O_TRUNC``), takes ``LOCK_EX`` in ``wait_for_save`` and writes
the same path from its own thread pool. Before 0.22 every rank writes the file inside its
forward (``save_kv_layer``), before the answer, and no ``.lock`` is made."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import serving
from support import requires_speculators, requires_vllm, speculators_in

pytestmark = [requires_vllm, requires_speculators,
              speculators_in(">=0.5", "speculators before 0.5 has no server-path client")]

# --dtype float32 against HF float32, as in test_server_path.py.
FP32_BOUND = 1e-4
TP2 = ("--tensor-parallel-size", "2", "--dtype", "float32")
# vLLM's CPU build binds each rank's OpenMP threads: one core each.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
FIRST = ((7, 33, 120), 7)  # (prompt lengths, seed) of each batch
SECOND = ((50, 9), 11)
# How long after its lock is released a second rank's write of the same file would land.
SETTLE_SECONDS = 10.0


@pytest.fixture(scope="module")
def llama_fp32(models_dir: Path) -> Path:
    return serving.llama_fp32(models_dir)


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def test_tp2_every_id_matches_hf_fp32_one_write_per_request(llama_fp32: Path,
                                                           tmp_path: Path) -> None:
    serving.skip_unless_the_cpu_build_serves()
    layer_ids = list(range(serving.num_layers(llama_fp32) + 1))
    batches = [serving.prompts(lengths, seed=seed) for lengths, seed in (FIRST, SECOND)]
    probe = serving.prompts((40,), seed=3)[0]
    with serving.serve(llama_fp32, tmp_path, layer_ids, *TP2, env=TP2_ENV) as srv:
        outs = []
        for number, prompts in enumerate(batches):
            run, out = serving.generate(srv, prompts, tmp_path / f"batch{number}")
            assert run.returncode == 0, run.stderr[-4000:] + srv.log_tail()
            outs.append(out)
        # One request read as vLLM's own load_hidden_states does (shared lock), then left
        # alone: a second writer of the same path would change it after the lock is free.
        status, body = srv.completion(probe)
        assert status == 200, f"HTTP {status}: {body}\n{srv.log_tail()}"
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        serving.wait_until_written(path)
        written = _stamp(path)
        time.sleep(SETTLE_SECONDS)
        settled = _stamp(path)
        left = sorted(p.name for p in srv.storage.iterdir())
        log = srv.log_text()
    assert "tensor_parallel_size=2" in log, log[-4000:]
    assert "server-path adapters applied" in log, log[-4000:]
    assert "Hidden-states write failed" not in log, log[-4000:]
    # The CLI moved every file it was given and removed its lock; nothing else was written.
    lock = [f"{path.name}.lock"] if serving.connector_makes_locks() else []
    expected = sorted([path.name, *lock])
    if serving.client_leaves_locks():
        # speculators 0.5.0's client: the lock of every file it moved stays behind.
        stray = [name for name in left if name not in expected]
        assert all(name.endswith(".lock") and name.removesuffix(".lock") not in left
                   for name in stray), left
        assert len(stray) == sum(len(prompts) for prompts in batches), left
        left = [name for name in left if name in expected]
    assert left == expected, left
    assert settled == written, f"{path} was written again after its lock was released"
    rows = []
    for out, prompts in zip(outs, batches, strict=True):
        assert serving.verify(out, llama_fp32, layer_ids)["ok"] is True
        rows += serving.compare_with_hf(out, llama_fp32, prompts, layer_ids)
    rows += _compare_one(path, llama_fp32, probe, layer_ids)
    prompt, layer, _, worst = max(rows, key=lambda r: r[3])
    print(f"TP=2 worst max relative error vs HF fp32: {worst:.2e} (prompt {prompt}, id {layer})")
    assert worst < FP32_BOUND, f"prompt {prompt}, id {layer}: {worst:.2e}"


def _compare_one(path: Path, model: Path, prompt: list[int],
                 layer_ids: list[int]) -> list[tuple[int, int, float, float]]:
    """The probe's file, as the CLI's files are compared (``hs_0.safetensors`` in a folder)."""
    folder = path.parent / "probe"
    folder.mkdir()
    os.link(path, folder / "hs_0.safetensors")
    assert serving.verify(folder, model, layer_ids)["ok"] is True
    return [(-1, layer, mean, worst) for _, layer, mean, worst
            in serving.compare_with_hf(folder, model, [prompt], layer_ids)]
