from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.adapters.kv_cache_config_from_groups import ID
from support import only, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


def test_raw_function_rejects_kv_cache_specs(vllm_config: Any, kv_cache_groups: Any) -> None:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    specs, groups = kv_cache_groups
    with pytest.raises(TypeError, match="kv_cache_specs"):
        get_kv_cache_config_from_groups(vllm_config=vllm_config, kv_cache_groups=groups,
                                        kv_cache_specs=specs, available_memory=64 << 20)


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


def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="kv_cache_specs"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass
