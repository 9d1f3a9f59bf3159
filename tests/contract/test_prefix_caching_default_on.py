from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.adapters.prefix_caching_default_on import ID
from support import make_request, only, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


def _scheduler(vllm_config: Any, kv_cache_config: Any, prefix_caching: bool) -> Any:
    import copy

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = copy.copy(vllm_config)
    config.cache_config = copy.copy(vllm_config.cache_config)
    config.cache_config.enable_prefix_caching = prefix_caching
    return Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(config), block_size=16)


def test_raw_prefix_caching_is_on_and_needs_a_block_hasher(
    vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.config import CacheConfig

    assert CacheConfig().enable_prefix_caching is True
    scheduler = _scheduler(vllm_config, kv_cache_config, prefix_caching=True)
    scheduler.add_request(make_request("r0", 40))  # two full blocks of 16
    with pytest.raises(AssertionError):
        scheduler.schedule()


def test_generator_cache_config_computes_every_token(
    generator_module: ModuleType, vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.config import CacheConfig

    with only(ID):
        config = generator_module.CacheConfig(block_size=16, gpu_memory_utilization=0.5)
        chosen = generator_module.CacheConfig(block_size=16, enable_prefix_caching=True)
    assert isinstance(config, CacheConfig) and config.enable_prefix_caching is False
    assert chosen.enable_prefix_caching is True  # an explicit choice is kept
    scheduler = _scheduler(vllm_config, kv_cache_config, prefix_caching=False)
    scheduler.add_request(make_request("r0", 40))
    assert scheduler.schedule().num_scheduled_tokens == {"r0": 40}
    assert generator_module.CacheConfig is CacheConfig


def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [40])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]) as gen, \
            pytest.raises(AssertionError):
        gen.generate(prompts)
