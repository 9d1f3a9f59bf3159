"""Contract tests: the raw upstream behaviour pinned, and speccompat's normalized one.

Each file is named after its adapter and runs the real vLLM and speculators
code; the normalized half fails if its adapter is removed.
"""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def generator_module() -> ModuleType:
    """speculators' generator module, imported once (it imports vLLM and transformers)."""
    from speculators.data_generation import vllm_hidden_states_generator

    return vllm_hidden_states_generator


def installed_vllm() -> str:
    import speccompat

    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version)


@pytest.fixture(scope="session")
def vllm_config(tiny_llama):  # type: ignore[no-untyped-def]
    """The VllmConfig speculators 0.3.0 builds, written out with today's required arguments."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    return VllmConfig(
        model_config=ModelConfig(model=str(tiny_llama), tokenizer=str(tiny_llama),
                                 dtype="auto", max_model_len=1024, enforce_eager=True),
        cache_config=CacheConfig(block_size=16, enable_prefix_caching=False),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        scheduler_config=SchedulerConfig(max_num_seqs=32, max_model_len=1024,
                                         max_num_batched_tokens=1024, is_encoder_decoder=False),
        device_config=DeviceConfig(),
        load_config=LoadConfig(),
    )


@pytest.fixture(scope="session")
def kv_cache_groups(vllm_config):  # type: ignore[no-untyped-def]
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_spec
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    specs = {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16) for i in range(4)}
    return specs, _get_kv_cache_groups_uniform_spec(specs)


@pytest.fixture
def kv_cache_config(vllm_config, kv_cache_groups):  # type: ignore[no-untyped-def]
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    _, groups = kv_cache_groups
    config = get_kv_cache_config_from_groups(vllm_config, groups, 64 << 20)
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks  # as speculators does
    return config
