"""vLLM's ExampleHiddenStatesConnector writes the rows it reads, zeros included: a file with
all-zero rows looks complete. The guard refuses the write (``ZeroHiddenStatesError``) and
leaves no file at that path.

From 0.22.0 the write is ``_write_tensors`` in the connector's thread pool, submitted with
the ``.lock`` held and ``_on_write_done`` as callback (0.22-0.23's ``wait_for_save``, 0.24+'s
``_submit_async_write``): driven here exactly so, with the real connector (set up by
``connector_drive``; on the CPU build with ``vllm.hidden_states_connector_cpu_writer``),
and on 0.24+ also through ``get_finished`` from a request whose blocks were never written.
0.17-0.21 call ``safetensors.torch.save_file`` from ``save_kv_layer``."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import connector_drive as drive
import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters import hidden_states_connector_cpu_writer as cpu_writer
from speccompat.server.adapters.hidden_states_connector_zero_rows import (
    FORWARD_WRITE,
    ID,
    THREAD_WRITE,
    ZeroHiddenStatesError,
    _zero_rows_in_torch,
    zero_rows,
)
from speccompat.targets import module_source
from support import needs_adapter, requires_vllm, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "no ExampleHiddenStatesConnector before vLLM 0.17.0")
threaded = vllm_in(">=0.22.0", "0.17-0.21 write inside save_kv_layer")
TOKENS = 150


@pytest.fixture(scope="module")
def hybrid(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with drive.hybrid_setup(tiny_llama, tmp_path_factory.mktemp("hs")) as setup:
        yield setup


@pytest.fixture
def guarded() -> Iterator[None]:
    report = registry._apply(only=[cpu_writer.ID, ID], paths=(ExtractionPath.SERVER,),
                              judge_support=False)
    assert report.state_of(ID) is speccompat.State.APPLIED, report
    try:
        yield
    finally:
        speccompat.revert()


@pytest.fixture
def unguarded() -> Iterator[None]:
    registry._apply(only=[cpu_writer.ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        yield
    finally:
        speccompat.revert()


def _states(hybrid: Any, zero: tuple[int, ...] = ()) -> Any:
    """bf16 states [150, layers, hidden]; rows ``zero`` of layer slot 1 all zeros."""
    import torch

    torch.manual_seed(1)
    states = torch.randn(TOKENS, len(drive.LAYER_IDS), hybrid.hidden)
    states = states.to(hybrid.config.model_config.dtype)
    for row in zero:
        states[row, 1] = 0
    return states


def _write_through_the_pool(connector: Any, states: Any, path: Path) -> Any:
    """The connector's own submission: ``.lock`` created and held (``wait_for_save``), the
    copy's event, ``_write_tensors`` on its pool, ``_on_write_done`` as callback."""
    import torch

    module = drive.connector_module()
    lock_fd = os.open(f"{path}.lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    event = module.torch.cuda.Event()
    event.record()
    tensors = {"hidden_states": states, "token_ids": torch.arange(states.shape[0])}
    future = connector._executor.submit(connector._write_tensors, tensors, event, str(path),
                                        lock_fd)
    future.add_done_callback(partial(connector._on_write_done, "req-0"))
    future.exception(timeout=60)
    return future


def _lock_released(path: Path) -> bool:
    with open(f"{path}.lock") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@vllm_in(">=0.17.0", "no ExampleHiddenStatesConnector before 0.17.0")
def test_raw_the_connector_writes_with_one_of_two_calls() -> None:
    source = module_source(drive.CONNECTOR) or ""
    assert (THREAD_WRITE in source) != (FORWARD_WRITE in source)


@threaded
@applies
def test_raw_zero_rows_are_written_as_a_complete_file(hybrid: Any, tmp_path: Path,
                                                      unguarded: None) -> None:
    path = tmp_path / "hs.safetensors"
    states = _states(hybrid, zero=(3, 4, 90))
    future = _write_through_the_pool(drive.make_connector(hybrid), states, path)
    assert future.exception() is None
    read = drive.connector_module().load_hidden_states(str(path))["hidden_states"]
    assert read.equal(states)  # zeros and all, nothing said
    assert zero_rows(read) == {1: 3}


@threaded
@applies
def test_a_zero_row_refuses_the_write_and_leaves_no_file(
        hybrid: Any, tmp_path: Path, guarded: None, caplog: pytest.LogCaptureFixture) -> None:
    import vllm

    path = tmp_path / "hs.safetensors"
    path.write_bytes(b"an older file at this path")
    connector = drive.make_connector(hybrid)
    with caplog.at_level(logging.ERROR):
        future = _write_through_the_pool(connector, _states(hybrid, zero=(3, 4, 90)), path)
    error = future.exception()
    assert isinstance(error, ZeroHiddenStatesError)
    message = str(error)
    assert message.startswith(f"speccompat refused to write {path}: rows of exact zeros "
                              f"(layer slot 1: 3 of {TOKENS} rows)")
    assert f"vLLM {vllm.__version__}" in message
    assert "block size on a hybrid" in message and "issue #20" in message
    assert not path.exists()  # neither this request's rows nor the older file
    assert _lock_released(path)  # a client waiting on the lock wakes up to no file
    # The connector goes on: the next request's file is written.
    good = tmp_path / "next.safetensors"
    assert _write_through_the_pool(connector, _states(hybrid), good).exception() is None
    assert drive.connector_module().load_hidden_states(str(good))["hidden_states"].equal(
        _states(hybrid))


@threaded
@applies
def test_rows_without_zeros_are_written_unchanged(hybrid: Any, tmp_path: Path,
                                                  guarded: None) -> None:
    import torch

    path = tmp_path / "hs.safetensors"
    states = _states(hybrid)
    states[7, 2, : hybrid.hidden // 2] = 0  # zeros in part of a row are data
    states[8, 0, 16:] = 0
    assert _write_through_the_pool(drive.make_connector(hybrid), states, path).exception() is None
    data = drive.connector_module().load_hidden_states(str(path))
    assert data["hidden_states"].equal(states)
    assert data["token_ids"].equal(torch.arange(TOKENS))


@vllm_in(">=0.24.0", "the worker extracts in get_finished from 0.24.0")
@applies
def test_a_request_on_unwritten_blocks_gets_no_file(hybrid: Any, tmp_path: Path,
                                                    guarded: None) -> None:
    """Through ``get_finished``: the request's second block was never written."""
    cache = drive.paged_cache(hybrid)
    drive.put(cache, [2], _states(hybrid)[: drive.GROUP_BLOCK])
    connector = drive.make_connector(hybrid)
    connector._block_size = drive.GROUP_BLOCK  # the right block size: the zeros are real
    drive.register(hybrid, connector, cache)
    path = tmp_path / "hs.safetensors"
    drive.save_finished(connector, "req-0", path, TOKENS, [2, 5])
    drive.wait_written(connector)
    assert not path.exists()
    assert _lock_released(path)


@vllm_in(">=0.17.0,<0.22.0", "0.22+ write from a thread pool")
@applies
def test_before_0_22_the_forward_write_is_skipped_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        module = drive.connector_module()
        states = torch.randn(5, 3, 64)
        states[2, 0] = 0
        path = tmp_path / "hs.safetensors"
        with caplog.at_level(logging.ERROR):
            module.safetensors.torch.save_file(
                {"hidden_states": states, "token_ids": torch.arange(5)}, str(path))
        assert report.state_of(ID) is speccompat.State.APPLIED
        assert not path.exists()
        module.safetensors.torch.save_file(
            {"hidden_states": states[3:], "token_ids": torch.arange(2)}, str(path))
        assert path.exists()
    finally:
        speccompat.revert()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_the_bits_reading_finds_what_torch_finds(dtype: str) -> None:
    """On CPU tensors the guard reads the values' bits through NumPy (no torch intra-op
    threads in vLLM's writer threads): +0 and -0 rows are zero rows, a row zero only in its
    first values or holding a NaN is not."""
    import torch

    torch.manual_seed(2)
    states = torch.randn(300, 4, 64).to(getattr(torch, dtype))
    states[::50, 1] = 0
    states[7, 2] = -0.0
    states[9, 3, :16] = 0
    states[11, 0] = float("nan")
    expected = {1: 6, 2: 1}
    assert _zero_rows_in_torch(states) == expected
    assert zero_rows(states) == expected
    strided = states.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, strided
    assert zero_rows(strided) == expected
    assert zero_rows(torch.randn(300, 4, 64).to(getattr(torch, dtype))) == {}


def test_other_devices_are_checked_in_torch() -> None:
    import torch

    from speccompat.server.adapters import hidden_states_connector_zero_rows as guard

    assert guard._magnitude_bits(torch.empty(2, 2, 2, device="meta")) is None
    assert guard._magnitude_bits(torch.zeros(2, 2, 2, dtype=torch.bfloat16)) is not None
