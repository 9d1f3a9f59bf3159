from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.adapters.scheduler_block_size import ID
from support import only, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


def _speculators_call(scheduler_cls: Any, vllm_config: Any, kv_cache_config: Any) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config))


def test_raw_scheduler_requires_block_size(vllm_config: Any, kv_cache_config: Any) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    assert inspect.signature(Scheduler).parameters["block_size"].default is inspect._empty
    with pytest.raises(TypeError, match="block_size"):
        _speculators_call(Scheduler, vllm_config, kv_cache_config)


def test_generator_call_gets_the_cache_block_size(
    generator_module: ModuleType, vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    with only(ID):
        scheduler = _speculators_call(generator_module.Scheduler, vllm_config, kv_cache_config)
    assert isinstance(scheduler, Scheduler)
    assert scheduler.block_size == vllm_config.cache_config.block_size == 16
    assert generator_module.Scheduler is Scheduler


def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="block_size"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass
