from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.inprocess.adapters.prefix_caching_default_on import ID
from support import (
    make_request,
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    scheduler_kwargs,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]
IN_0_4 = "speculators 0.4.0 builds its CacheConfig with prefix caching off"
# cache_full_blocks without the request's block hashes: an assert (vLLM 0.16), an
# IndexError on the missing hashes (0.29).
NO_BLOCK_HASHES = (AssertionError, IndexError)


def _scheduler(vllm_config: Any, kv_cache_config: Any, prefix_caching: bool | None) -> Any:
    import copy

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = copy.copy(vllm_config)
    config.cache_config = copy.copy(vllm_config.cache_config)
    config.cache_config.enable_prefix_caching = prefix_caching
    return Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(config),
                     **scheduler_kwargs(config))


def test_raw_prefix_caching_is_on_and_needs_a_block_hasher(
    vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.config import CacheConfig

    if not CacheConfig().enable_prefix_caching:
        pytest.skip("a CacheConfig built by hand has prefix caching off on this vLLM "
                    "(test_raw_hand_built_cache_config_has_prefix_caching_off)")
    assert CacheConfig().enable_prefix_caching is True
    scheduler = _scheduler(vllm_config, kv_cache_config, prefix_caching=True)
    scheduler.add_request(make_request("r0", 40))  # two full blocks of 16
    with pytest.raises(NO_BLOCK_HASHES):
        scheduler.schedule()


@vllm_in("<0.12.0", "0.11.0 to 0.11.2 have enable_prefix_caching=None (seen in the 0.11.0 "
         "and 0.11.1 cells, and 0.11.2's source); 0.12.0 defaults it to True")
def test_raw_hand_built_cache_config_has_prefix_caching_off(
    vllm_config: Any, kv_cache_config: Any
) -> None:
    """What speculators 0.3.0's generator builds on vLLM 0.11.0 (only EngineArgs turns prefix
    caching on): every token is computed, with no block hasher needed."""
    from vllm.config import CacheConfig

    assert CacheConfig().enable_prefix_caching is None
    scheduler = _scheduler(vllm_config, kv_cache_config, prefix_caching=None)
    scheduler.add_request(make_request("r0", 40))
    assert scheduler.schedule().num_scheduled_tokens == {"r0": 40}


@needs_adapter(ID, IN_0_4)
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


@needs_adapter(ID, IN_0_4)
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [40])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]) as gen, \
            pytest.raises(NO_BLOCK_HASHES):
        gen.generate(prompts)
