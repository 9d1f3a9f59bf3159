"""vLLM 0.24's ExampleHiddenStatesConnector rebuilds a finished request's read slots with
``cache_config.block_size``; on a hybrid verifier the hidden-states group keeps a smaller
block, and the file gets all-zero rows and other tokens' states (vLLM PR #46301, fixed in
0.25.0). The adapter makes it read with the group's own block size.

The real connector, engine config, ``KVCacheConfig`` with a ``HiddenStateCacheSpec`` group
(blocks of 96 where the engine's are 144, as a hybrid model makes them) and paged cache
come from ``connector_drive``; the write goes through the connector's own ``get_finished``
and thread pool, read back with vLLM's ``load_hidden_states``. On the CPU build the writer
needs ``vllm.hidden_states_connector_cpu_writer``, applied in every case here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import connector_drive as drive
import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters import hidden_states_connector_cpu_writer as cpu_writer
from speccompat.server.adapters.hidden_states_connector_group_block_size import (
    GLOBAL_BLOCK_SIZE,
    ID,
    SLOT_REBUILD,
)
from speccompat.targets import module_source
from support import needs_adapter, requires_vllm, state_under_user_apply, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "0.22-0.23 read the layer's own slot mapping; 0.25+ the group's "
                            "block size")
rebuilds_slots = vllm_in(">=0.24.0", "before 0.24.0 the worker does not rebuild read slots "
                                     "from block ids in get_finished")
TOKENS = 150  # two blocks of the group: [2, 0]
OTHER = 40  # another request's tokens, in block 4


@pytest.fixture(scope="module")
def hybrid(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with drive.hybrid_setup(tiny_llama, tmp_path_factory.mktemp("hs")) as setup:
        yield setup


def _apply(*ids: str) -> None:
    report = registry._apply(only=[cpu_writer.ID, *ids], paths=(ExtractionPath.SERVER,),
                              judge_support=False)
    for i in ids:
        assert report.state_of(i) is speccompat.State.APPLIED, report


def _extract(hybrid: Any, path: Path, *, with_kv_cache_config: bool = True) -> dict[str, Any]:
    """One request (150 tokens in the group's blocks [2, 0]) and another's 40 tokens in
    block 4; the connector writes the first; returns what was stored and what was read."""
    import torch

    torch.manual_seed(0)
    dtype = hybrid.config.model_config.dtype
    mine = torch.randn(TOKENS, len(drive.LAYER_IDS), hybrid.hidden).to(dtype)
    other = torch.randn(OTHER, len(drive.LAYER_IDS), hybrid.hidden).to(dtype)
    cache = drive.paged_cache(hybrid)
    drive.put(cache, [2, 0], mine)
    drive.put(cache, [4], other)
    connector = drive.make_connector(hybrid, with_kv_cache_config=with_kv_cache_config)
    block_after_init = connector._block_size
    drive.register(hybrid, connector, cache)
    drive.save_finished(connector, "req-0", path, TOKENS, [2, 0])
    drive.wait_written(connector)
    read = drive.connector_module().load_hidden_states(str(path))["hidden_states"]
    return {"mine": mine, "other": other, "read": read, "init": block_after_init,
            "block": connector._block_size}


def _zero_rows(states: Any) -> int:
    return int((states == 0).all(dim=2).any(dim=1).sum())


def _rows_from(read: Any, source: Any) -> int:
    return sum(1 for row in read if any(row.equal(s) for s in source))


@vllm_in(">=0.24.0,<0.25.0", "0.22-0.23 never read with it; 0.25.0 reads the group's spec")
def test_raw_the_connector_rebuilds_slots_with_the_engines_block_size() -> None:
    source = module_source(drive.CONNECTOR)
    assert source is not None
    assert GLOBAL_BLOCK_SIZE in source
    assert SLOT_REBUILD in source


@applies
def test_raw_the_file_holds_zero_rows_and_other_tokens_states(hybrid: Any,
                                                             tmp_path: Path) -> None:
    _apply()
    try:
        assert ID not in registry.active()
        out = _extract(hybrid, tmp_path / "raw.safetensors")
    finally:
        speccompat.revert()
    assert out["block"] == drive.ENGINE_BLOCK
    assert out["read"].shape == out["mine"].shape  # looks complete
    assert not out["read"].equal(out["mine"])
    # Rows 0-143 read slots 288-431: the group's block 3 (96 unwritten rows) and block 4
    # (the other request's 40 states, then 8 unwritten rows); rows 144-149 read slots 0-5,
    # this request's tokens 96-101.
    assert _zero_rows(out["read"]) == 96 + 8
    assert _rows_from(out["read"], out["other"]) == OTHER
    assert out["read"][144:].equal(out["mine"][96:102])


@applies
def test_the_connector_reads_with_the_groups_block_size(hybrid: Any, tmp_path: Path) -> None:
    _apply(ID)
    try:
        out = _extract(hybrid, tmp_path / "hs.safetensors")
    finally:
        speccompat.revert()
    assert out["init"] == drive.GROUP_BLOCK  # from the KVCacheConfig's HiddenStateCacheSpec
    assert out["read"].equal(out["mine"])
    assert _zero_rows(out["read"]) == 0


@applies
def test_without_a_kv_cache_config_the_registered_cache_decides(hybrid: Any,
                                                                tmp_path: Path) -> None:
    _apply(ID)
    try:
        out = _extract(hybrid, tmp_path / "hs.safetensors", with_kv_cache_config=False)
    finally:
        speccompat.revert()
    assert out["init"] == drive.ENGINE_BLOCK  # nothing to read the group from yet
    assert out["block"] == drive.GROUP_BLOCK
    assert out["read"].equal(out["mine"])


@vllm_in(">=0.25.0", "the connector reads the engine's block size before 0.25.0")
@rebuilds_slots
def test_fixed_upstream_the_same_request_reads_back_unchanged(hybrid: Any,
                                                              tmp_path: Path) -> None:
    from speccompat.server.adapters.hidden_states_connector_group_block_size import ADAPTER

    assert not ADAPTER.wants(speccompat.detect())[0]
    assert "_get_cache_block_size" in (module_source(drive.CONNECTOR) or "")
    _apply()
    try:
        out = _extract(hybrid, tmp_path / "hs.safetensors")
    finally:
        speccompat.revert()
    assert out["read"].equal(out["mine"])


@vllm_in(">=0.22.0,<0.24.0", "only 0.22-0.23 extract in save_kv_layer")
def test_before_0_24_the_block_size_is_set_but_never_read() -> None:
    from speccompat.server.adapters.hidden_states_connector_group_block_size import ADAPTER

    source = module_source(drive.CONNECTOR) or ""
    assert GLOBAL_BLOCK_SIZE in source
    assert source.count("self._block_size") == 1  # the assignment only
    assert "get_forward_context().slot_mapping[layer_name]" in source
    assert not ADAPTER.wants(speccompat.detect())[0]


@applies
def test_user_apply_leaves_it_to_the_plugin() -> None:
    assert state_under_user_apply(ID) is speccompat.State.SKIPPED
