from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.inprocess.adapters.kv_cache_specs_removed import ID, ID_V04
from support import (
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


# --------------------------------------------------------------------------- speculators 0.3.0


@vllm_in(">=0.12.0", "get_kv_cache_config_from_groups requires kv_cache_specs before 0.12.0")
def test_raw_function_rejects_kv_cache_specs(vllm_config: Any, kv_cache_groups: Any) -> None:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    specs, groups = kv_cache_groups
    with pytest.raises(TypeError, match="kv_cache_specs"):
        get_kv_cache_config_from_groups(vllm_config=vllm_config, kv_cache_groups=groups,
                                        kv_cache_specs=specs, available_memory=64 << 20)


@needs_adapter(ID, "speculators 0.4.0 does not pass kv_cache_specs")
def test_generator_call_plans_the_same_cache(
    generator_module: ModuleType, vllm_config: Any, kv_cache_groups: Any
) -> None:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    specs, groups = kv_cache_groups
    expected = get_kv_cache_config_from_groups(
        vllm_config=vllm_config, kv_cache_groups=groups, available_memory=64 << 20)
    with only(ID):
        planned = generator_module.get_kv_cache_config_from_groups(
            vllm_config=vllm_config, kv_cache_groups=groups, kv_cache_specs=specs,
            available_memory=64 << 20)
    assert planned.num_blocks == expected.num_blocks > 0
    assert generator_module.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups


@needs_adapter(ID, "speculators 0.4.0 does not pass kv_cache_specs")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="kv_cache_specs"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass


# --------------------------------------------------------------------------- speculators 0.4.0


@vllm_in("<0.12.0", "get_kv_cache_config_from_groups takes no kv_cache_specs from 0.12.0 on")
def test_raw_function_requires_kv_cache_specs(vllm_config: Any, kv_cache_groups: Any) -> None:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    _, groups = kv_cache_groups
    with pytest.raises(TypeError, match="kv_cache_specs"):
        get_kv_cache_config_from_groups(vllm_config=vllm_config, kv_cache_groups=groups,
                                        available_memory=64 << 20)


@needs_adapter(ID_V04, "this vLLM plans the cache without kv_cache_specs, as 0.4.0 calls it")
def test_v04_generator_call_plans_the_same_cache(
    generator_module: ModuleType, vllm_config: Any, kv_cache_groups: Any
) -> None:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    specs, groups = kv_cache_groups
    expected = get_kv_cache_config_from_groups(
        vllm_config=vllm_config, kv_cache_groups=groups, kv_cache_specs=specs,
        available_memory=64 << 20)
    with only(ID_V04):
        planned = generator_module.get_kv_cache_config_from_groups(
            vllm_config=vllm_config, kv_cache_groups=groups, available_memory=64 << 20)
        positional = generator_module.get_kv_cache_config_from_groups(
            vllm_config, groups, 64 << 20)
    assert planned.num_blocks == positional.num_blocks == expected.num_blocks > 0
    assert planned.kv_cache_tensors == expected.kv_cache_tensors
    assert generator_module.get_kv_cache_config_from_groups is get_kv_cache_config_from_groups


@needs_adapter(ID_V04, "this vLLM plans the cache without kv_cache_specs, as 0.4.0 calls it")
def test_v04_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="kv_cache_specs"), speculators_generator(
        tiny_llama, exclude=(ID_V04,), layer_ids=[1]
    ):
        pass
