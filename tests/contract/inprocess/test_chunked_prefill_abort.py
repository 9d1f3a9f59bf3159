from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speccompat.inprocess.adapters.chunked_prefill_abort import ID
from support import (
    chunked_prefill_on,
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
IN_0_4 = "speculators 0.4.0 aborts its requests only once every prompt is prefilled (PR #283)"


def _run_speculators_loop(scheduler: Any) -> dict[str, int]:
    """speculators 0.3.0's generate() loop (without the executor): tokens scheduled per request."""
    from vllm.v1.request import RequestStatus

    scheduled: dict[str, int] = {}
    while (output := scheduler.schedule()).total_num_scheduled_tokens > 0:
        for req_id, count in output.num_scheduled_tokens.items():
            scheduled[req_id] = scheduled.get(req_id, 0) + count
        for req_id in output.num_scheduled_tokens:
            scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
    return scheduled


def _scheduler(cls: Any, vllm_config: Any, kv_cache_config: Any) -> Any:
    from vllm.v1.structured_output import StructuredOutputManager

    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               **scheduler_kwargs(vllm_config))


def test_raw_loop_drops_the_rest_of_a_chunked_prompt(
    vllm_config: Any, kv_cache_config: Any
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    if not chunked_prefill_on(vllm_config.scheduler_config):
        pytest.skip("a SchedulerConfig built by hand has chunked prefill off on this vLLM "
                    "(test_raw_hand_built_scheduler_config_does_not_chunk): no prompt is cut")
    budget = vllm_config.scheduler_config.max_num_batched_tokens  # 1024
    scheduler = _scheduler(Scheduler, vllm_config, kv_cache_config)
    for i, length in enumerate([700, 700]):
        scheduler.add_request(make_request(f"r{i}", length))
    assert _run_speculators_loop(scheduler) == {"r0": 700, "r1": budget - 700}


@vllm_in("<0.11.1", "checked on vLLM 0.11.0, whose SchedulerConfig has "
         "enable_chunked_prefill=None; 0.12.0 defaults it to True")
def test_raw_hand_built_scheduler_config_does_not_chunk(
    vllm_config: Any, kv_cache_config: Any
) -> None:
    """What speculators' generators build on vLLM 0.11.0 (only EngineArgs turns chunked prefill
    on): a prompt that does not fit the step waits for the next one and runs whole."""
    from vllm.v1.core.sched.scheduler import Scheduler

    assert not chunked_prefill_on(vllm_config.scheduler_config)
    scheduler = _scheduler(Scheduler, vllm_config, kv_cache_config)
    for i, length in enumerate([700, 700]):
        scheduler.add_request(make_request(f"r{i}", length))
    assert _run_speculators_loop(scheduler) == {"r0": 700, "r1": 700}


@needs_adapter(ID, IN_0_4)
def test_generator_scheduler_finishes_every_prefill(
    generator_module: ModuleType, vllm_config: Any, kv_cache_config: Any
) -> None:
    with only(ID):
        scheduler = _scheduler(generator_module.Scheduler, vllm_config, kv_cache_config)
    for i, length in enumerate([700, 700, 30]):
        scheduler.add_request(make_request(f"r{i}", length))
    assert _run_speculators_loop(scheduler) == {"r0": 700, "r1": 700, "r2": 30}
    assert not scheduler.requests  # every request was aborted once prefilled


@needs_adapter(ID, IN_0_4)
@vllm_in(">=0.11.1", "vLLM 0.11.0's SchedulerConfig leaves chunked prefill off unless "
         "asked: the generator never splits a prompt there")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    # 3 x 3000 tokens exceed the 8192-token step: the third prompt is cut after 2192.
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [3000, 3000, 3000])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1],
                               max_model_len=4096) as gen, \
            pytest.raises(RuntimeError, match="fully prefilled"):
        gen.generate(prompts)
