from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.inprocess.adapters.scheduler_block_size import ID, ID_V04
from support import (
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


def _speculators_call(scheduler_cls: Any, vllm_config: Any, kv_cache_config: Any,
                      **extra: Any) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config), **extra)


# --------------------------------------------------------------------------- speculators 0.3.0


@vllm_in(">=0.11.1", "Scheduler.__init__ takes no block_size before 0.11.1")
def test_raw_scheduler_requires_block_size(vllm_config: Any, kv_cache_config: Any) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    assert inspect.signature(Scheduler).parameters["block_size"].default is inspect._empty
    with pytest.raises(TypeError, match="block_size"):
        _speculators_call(Scheduler, vllm_config, kv_cache_config)


@needs_adapter(ID, "speculators 0.4.0 passes block_size itself")
def test_generator_call_gets_the_cache_block_size(
    generator_module: ModuleType, vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    with only(ID):
        scheduler = _speculators_call(generator_module.Scheduler, vllm_config, kv_cache_config)
    assert isinstance(scheduler, Scheduler)
    assert scheduler.block_size == vllm_config.cache_config.block_size == 16
    assert generator_module.Scheduler is Scheduler


@needs_adapter(ID, "speculators 0.4.0 passes block_size itself")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="block_size"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ):
        pass


# --------------------------------------------------------------------------- speculators 0.4.0


@vllm_in("<0.11.1", "Scheduler.__init__ takes block_size from 0.11.1 on")
def test_raw_scheduler_rejects_block_size(vllm_config: Any, kv_cache_config: Any) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "block_size" not in inspect.signature(Scheduler).parameters
    with pytest.raises(TypeError, match="block_size"):
        _speculators_call(Scheduler, vllm_config, kv_cache_config, block_size=16)
    # What it schedules with instead:
    assert _speculators_call(Scheduler, vllm_config, kv_cache_config).block_size == 16


@needs_adapter(ID_V04, "this vLLM takes the block_size speculators 0.4.0 passes")
def test_v04_generator_call_drops_the_block_size_it_already_has(
    generator_module: ModuleType, vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    with only(ID_V04):
        scheduler = _speculators_call(generator_module.Scheduler, vllm_config, kv_cache_config,
                                      block_size=16)
        with pytest.raises(ValueError, match="differs from the cache config"):
            _speculators_call(generator_module.Scheduler, vllm_config, kv_cache_config,
                              block_size=32)
    assert isinstance(scheduler, Scheduler)
    assert scheduler.block_size == vllm_config.cache_config.block_size == 16
    assert generator_module.Scheduler is Scheduler


@needs_adapter(ID_V04, "this vLLM takes the block_size speculators 0.4.0 passes")
def test_v04_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(TypeError, match="block_size"), speculators_generator(
        tiny_llama, exclude=(ID_V04,), layer_ids=[1]
    ):
        pass
