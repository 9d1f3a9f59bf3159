"""vLLM's real ``ExampleHiddenStatesConnector`` in this process, set up as a hybrid verifier's
worker sets it up, for the contract tests of the adapters around its writer.

The engine config is ``EngineArgs(...).create_engine_config()`` for a tiny Llama with
``extract_hidden_states`` and the connector; then ``cache_config.block_size`` is raised to
144, as vLLM raises it for a hybrid model (Qwen3-Next m1 on the H200: "Setting attention
block size to 144"), while the hidden-states group (a real ``HiddenStateCacheSpec``) keeps
blocks of 96. The cache-only layer is vLLM's own ``CacheOnlyAttentionLayer``, its cache laid
out by its backend and filled by its own ``basic_cache``. The plugin stays out of the way
(``SPECCOMPAT_DISABLE=1`` while the config is made): each test applies what it tests.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import speccompat
from speccompat import server

CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
CACHE_LAYER = "model.cache_only_layers.4"
ATTENTION_LAYER = "model.layers.1.self_attn.attn"
ENGINE_BLOCK = 144  # cache_config.block_size, raised for the hybrid model
GROUP_BLOCK = 96  # the hidden-states group's own
NUM_BLOCKS = 8
LAYER_IDS = [1, 2, 4]


@dataclass
class Hybrid:
    config: Any  # VllmConfig
    kv_cache_config: Any  # KVCacheConfig: attention group (144), hidden-states group (96)
    hidden: int
    storage: Path


@contextlib.contextmanager
def hybrid_setup(model: Path, storage: Path) -> Iterator[Hybrid]:
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        HiddenStateCacheSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    had_server_env = server.SERVER_ENV in os.environ
    old_disable = os.environ.get("SPECCOMPAT_DISABLE")
    os.environ["SPECCOMPAT_DISABLE"] = "1"
    try:
        config = EngineArgs(
            model=str(model), max_model_len=256, enforce_eager=True,
            enable_chunked_prefill=False,  # 0.22-0.23 refuse the connector otherwise
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {
                                    "eagle_aux_hidden_state_layer_ids": LAYER_IDS}}},
            kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector",
                                "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
        ).create_engine_config()
    finally:
        if old_disable is None:
            os.environ.pop("SPECCOMPAT_DISABLE")
        else:
            os.environ["SPECCOMPAT_DISABLE"] = old_disable
        if not had_server_env:
            os.environ.pop(server.SERVER_ENV, None)
    speccompat.revert()  # whatever a plugin load earlier in this process left applied
    config.cache_config.block_size = ENGINE_BLOCK
    hidden = config.model_config.get_hidden_size()
    dtype = config.model_config.dtype
    initialised = False
    with set_current_vllm_config(config):
        CacheOnlyAttentionLayer(num_heads=len(LAYER_IDS), head_size=hidden,
                                cache_config=config.cache_config, prefix=CACHE_LAYER)
        if not parallel_state.model_parallel_is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
            parallel_state.initialize_model_parallel(1, 1)
            initialised = True
    kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([ATTENTION_LAYER], FullAttentionSpec(
            block_size=ENGINE_BLOCK, num_kv_heads=2, head_size=16, dtype=dtype)),
        KVCacheGroupSpec([CACHE_LAYER], HiddenStateCacheSpec(
            block_size=GROUP_BLOCK, num_kv_heads=len(LAYER_IDS), head_size=hidden,
            dtype=dtype)),
    ])
    try:
        yield Hybrid(config, kv_cache_config, hidden, storage)
    finally:
        if initialised:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()


def connector_module() -> Any:
    import importlib

    return importlib.import_module(CONNECTOR)


def make_connector(hybrid: Hybrid, *, with_kv_cache_config: bool = True) -> Any:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    module = connector_module()
    with set_current_vllm_config(hybrid.config):
        return module.ExampleHiddenStatesConnector(
            hybrid.config, KVConnectorRole.WORKER,
            hybrid.kv_cache_config if with_kv_cache_config else None)


def paged_cache(hybrid: Hybrid) -> Any:
    """The hidden-states group's cache as its backend lays it out, all zeros (vLLM
    allocates caches zeroed), blocks of ``GROUP_BLOCK``."""
    import torch
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionBackend

    if hasattr(CacheOnlyAttentionBackend, "get_kv_cache_shape"):  # up to 0.28
        shape = CacheOnlyAttentionBackend.get_kv_cache_shape(
            NUM_BLOCKS, GROUP_BLOCK, len(LAYER_IDS), hybrid.hidden)
    else:
        # 0.29+ lays the cache out from the spec, layers before tokens, as basic_cache
        # and the connector's extract_from_kv_cache read it (block size = shape[2]).
        shape = (NUM_BLOCKS, len(LAYER_IDS), GROUP_BLOCK, hybrid.hidden)
    return torch.zeros(shape, dtype=hybrid.config.model_config.dtype)


def put(cache: Any, blocks: list[int], states: Any) -> None:
    """Store ``states`` [tokens, layers, hidden] in ``blocks`` as the cache-only layer does."""
    import torch
    from vllm.model_executor.models.extract_hidden_states import basic_cache

    slots = torch.cat([torch.arange(GROUP_BLOCK) + b * GROUP_BLOCK for b in blocks])
    basic_cache(states, cache, slots[:states.shape[0]])


def register(hybrid: Hybrid, connector: Any, cache: Any) -> None:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(hybrid.config):
        connector.register_kv_caches({CACHE_LAYER: cache})


def save_finished(connector: Any, req_id: str, path: Path, tokens: int,
                  blocks: list[int]) -> None:
    """What the worker does for a finished request from vLLM 0.24.0 on: the scheduler's
    pending save arrives in the connector metadata and ``get_finished`` submits the write
    (its ``.lock`` held until the file is written)."""
    import torch

    module = connector_module()
    meta = module.ExampleHiddenStatesConnectorMetadata(
        pending_saves=[module.PendingSave(req_id, str(path), torch.arange(tokens), blocks)])
    connector.bind_connector_metadata(meta)
    try:
        connector.get_finished(set())
    finally:
        connector.clear_connector_metadata()


def wait_written(connector: Any) -> None:
    """Until the writer threads are done (the connector's own pool)."""
    connector._executor.shutdown(wait=True)
