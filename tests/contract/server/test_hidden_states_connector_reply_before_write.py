"""From vLLM 0.24.0 the server replies with a hidden-states path before the file is written:
``request_finished`` hands the path to the reply, the worker copies the states out at its
next ``get_finished`` and a thread writes them behind ``<path>.lock``. speculators 0.5.0's
client moves the file at once (FileNotFoundError in the matrix cell 0.26.0 x 0.5.0). With
the adapter the API server answers once the lock is free.

The raw facts on the real scheduler-side connector (``connector_drive``'s engine config);
the normalized and fails-without-it tests on real servers (``vllm.entrypoints.openai.
api_server`` with ``extract_hidden_states`` and the stock connector), replies read at the
moment they arrive, with no client-side wait."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import connector_drive as drive
import serving
from speccompat.registry import SKIP_ENV
from speccompat.server.adapters.hidden_states_connector_reply_before_write import (
    ID,
    REPLY,
    THREAD_WRITE,
    _probe,
    lock_is_held,
)
from speccompat.targets import module_source
from support import make_request, needs_adapter, requires_vllm, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "before vLLM 0.24.0 the connector writes inside the forward, "
                            "before the reply; speculators 0.6.0 on wait on <path>.lock")
LAYER_IDS = [1, 2, 4]
# Concurrent requests per server: enough that an early reply is seen without the adapter.
REQUESTS = 8
PROMPT_LENGTHS = [700, 650, 600, 550, 500, 450, 400, 350]


@pytest.fixture(scope="module")
def setup(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with drive.hybrid_setup(tiny_llama, tmp_path_factory.mktemp("hs")) as hybrid:
        yield hybrid


@vllm_in(">=0.24.0", "before 0.24.0 the connector writes inside the forward")
def test_raw_the_reply_names_a_file_not_yet_written(setup: Any) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    assert _probe() is None
    with set_current_vllm_config(setup.config):
        connector = drive.connector_module().ExampleHiddenStatesConnector(
            setup.config, KVConnectorRole.SCHEDULER, setup.kv_cache_config)
    path = str(setup.storage / "req-1.safetensors")
    connector._request_filenames["req-1"] = path  # what build_connector_meta records
    delay, params = connector.request_finished(make_request("req-1", 12), [1])
    # The reply's path, with the write still ahead: a pending save for the worker's next
    # get_finished, nothing on disk yet.
    assert (delay, params) == (True, {"hidden_states_path": path})
    assert "req-1" in connector._pending_saves and not Path(path).exists()
    source = module_source(drive.CONNECTOR) or ""
    assert REPLY in source and THREAD_WRITE in source


def _replies(srv: serving.Server, prompts: list[list[int]]) -> list[tuple[bool, bool, Path]]:
    """Each reply, at the moment it arrives: (its lock still held, its file on disk, the
    path)."""

    def one(prompt: list[int]) -> tuple[bool, bool, Path]:
        status, body = srv.completion(prompt)
        assert status == 200, f"HTTP {status}: {body}\n{srv.log_tail()}"
        path = Path(body["kv_transfer_params"]["hidden_states_path"])
        return lock_is_held(str(path)), path.exists(), path

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def _check_files(paths: list[Path], prompts: list[list[int]]) -> None:
    """Each file, once written, holds its prompt's states: [tokens, ids, hidden]."""
    from safetensors.torch import load_file

    for path, prompt in zip(paths, prompts, strict=True):
        data = load_file(str(path))
        assert data["token_ids"].tolist() == prompt
        assert data["hidden_states"].shape[:2] == (len(prompt), len(LAYER_IDS))


@applies
def test_normalized_each_reply_comes_with_its_file_written(tiny_llama: Path,
                                                           tmp_path: Path) -> None:
    serving.skip_unless_the_cpu_build_serves()
    prompts = serving.prompts(PROMPT_LENGTHS)
    with serving.serve(tiny_llama, tmp_path, LAYER_IDS) as srv:
        seen = _replies(srv, prompts)
        assert [(held, exists) for held, exists, _ in seen] == [(False, True)] * REQUESTS, (
            seen, srv.log_tail())
        _check_files([path for _, _, path in seen], prompts)


@applies
def test_without_it_a_reply_comes_before_its_file(tiny_llama: Path, tmp_path: Path) -> None:
    serving.skip_unless_the_cpu_build_serves()
    prompts = serving.prompts(PROMPT_LENGTHS)
    with serving.serve(tiny_llama, tmp_path, LAYER_IDS, env={SKIP_ENV: ID}) as srv:
        seen = _replies(srv, prompts)
        early = sum(held or not exists for held, exists, _ in seen)
        print(f"without the adapter: {early} of {REQUESTS} replies before their file")
        assert early, seen
        for _, _, path in seen:
            serving.wait_until_written(path)  # what speculators 0.6.0 on do
        _check_files([path for _, _, path in seen], prompts)
