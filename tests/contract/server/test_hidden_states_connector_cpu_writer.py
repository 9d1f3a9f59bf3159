"""vLLM's ExampleHiddenStatesConnector writes through CUDA streams, events and pinned memory
(from 0.22.0); on the CPU build the adapter gives its module synchronous stand-ins.

The whole server path with this adapter (and without it: only ``<path>.lock`` appears) is
in tests/e2e/server/test_server_path.py; here the connector module's own pieces are driven in
the order its writer drives them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.hidden_states_connector_cpu_writer import (
    ADAPTER,
    CONNECTOR,
    CUDA_USES,
    ID,
    CpuTorch,
)
from speccompat.targets import module_source
from speccompat.versions import RESOLVED_PLATFORM, detect, vllm_platform
from support import needs_adapter, requires_vllm, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "no asynchronous CUDA writer in the connector before vLLM 0.22.0")


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


cpu_only = pytest.mark.skipif(not _on_cpu(), reason="the adapter patches nothing on CUDA")


def _connector() -> ModuleType:
    return importlib.import_module(CONNECTOR)


def _write_like_the_connector(module: ModuleType, path: Path) -> dict[str, Any]:
    """The writer's steps with the module's own ``torch`` and functions: a paged cache of
    3 blocks of 4 slots, a request on blocks [2, 0] with 6 tokens, copied on the copy
    stream into pinned memory, then ``_write_tensors`` with the copy's event. The cache is
    [3, 4, 4, hidden], so it reads the same whether the release puts the slot in dimension
    1 (0.22-0.26) or 2 (0.32)."""
    import torch

    hidden = 8
    kv = torch.arange(3 * 4 * 4 * hidden, dtype=torch.float32).reshape(3, 4, 4, hidden)
    slots = torch.tensor([8, 9, 10, 11, 0, 1])
    expected = module.extract_from_kv_cache(kv, slots, 6).clone()  # no CUDA primitive here
    t = module.torch
    stream = t.cuda.Stream()
    ready = t.cuda.Event()
    ready.record()
    stream.wait_event(ready)
    with t.cuda.stream(stream):
        states = module.extract_from_kv_cache(kv, slots.to(device=kv.device, non_blocking=True),
                                              6)
        pinned = t.empty_like(states, device="cpu", pin_memory=True)
        pinned.copy_(states, non_blocking=True)
    done = t.cuda.Event()
    done.record(stream)
    tensors = {"hidden_states": pinned, "token_ids": torch.arange(6)}
    module.ExampleHiddenStatesConnector._write_tensors(tensors, done, str(path), None)
    assert done.query()
    return {"expected": expected, "path": path}


@vllm_in(">=0.22.0", "the connector has no asynchronous CUDA writer before 0.22.0")
def test_raw_the_writer_uses_cuda_only_primitives() -> None:
    source = module_source(CONNECTOR)
    assert source is not None
    assert [use for use in CUDA_USES if use not in source] == []
    writer = inspect.signature(_connector().ExampleHiddenStatesConnector._write_tensors)
    assert list(writer.parameters) == ["tensors", "event", "filename", "lock_fd"]


@applies
@cpu_only
def test_raw_those_primitives_fail_on_the_cpu_build(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"NVIDIA driver|CUDA|wait_event|pin"):
        _write_like_the_connector(_connector(), tmp_path / "raw.safetensors")
    assert not (tmp_path / "raw.safetensors").exists()


@applies
@cpu_only
def test_the_connector_writes_synchronously_with_it(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        module = _connector()
        assert type(vars(module)["torch"]) is CpuTorch
        written = _write_like_the_connector(module, tmp_path / "hs.safetensors")
        data = load_file(str(written["path"]))
        assert data["hidden_states"].equal(written["expected"])
        assert data["token_ids"].tolist() == list(range(6))
    finally:
        speccompat.revert()
    assert type(vars(_connector())["torch"]) is not CpuTorch  # revert restores the module


@applies
def test_user_apply_leaves_it_to_the_plugin() -> None:
    report = registry._apply(only=[ID], judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.SKIPPED
        assert ID not in registry.active()
    finally:
        speccompat.revert()
    assert os.environ.get("SPECCOMPAT_EXTRACT_HIDDEN_STATES") != "1"


@applies
def test_selected_only_on_vllms_cpu_platform() -> None:
    """In vLLM's processes a CUDA wheel's environment names no platform: vLLM's own
    ``current_platform`` decides, so on CUDA the server log does not list the adapter."""
    import vllm.platforms
    from vllm.platforms import current_platform

    # The resolved platform is where speccompat reads it, never resolving it itself.
    assert getattr(vllm.platforms, RESOLVED_PLATFORM) is current_platform
    env = dataclasses.replace(detect(), platform=None)
    verdict = registry.select(ADAPTER, env, probe=True)
    if current_platform.is_cpu():
        assert vllm_platform() == "cpu"
        assert verdict.wanted and verdict.mismatch is None
    elif current_platform.is_unspecified():  # a CUDA wheel without a GPU: the hook decides
        assert vllm_platform() is None and verdict.wanted
    else:
        assert not verdict.wanted and verdict.off_platform
        assert verdict.why.startswith(f"vLLM's platform here is {vllm_platform()};")
