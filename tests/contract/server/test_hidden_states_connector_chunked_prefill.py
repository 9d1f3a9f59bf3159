"""vLLM 0.22-0.23's ExampleHiddenStatesConnector writes a request from the slots of the step
it arrives in, and VllmConfig refuses chunked prefill with it; the adapter writes each
prompt whole in the step its prefill completes, and lifts the refusal.

The connector's own scheduler side and worker side are driven here, step by step, as the
scheduler and the model runner drive them: a 200-token prompt cut into chunks of at most 64
tokens (blocks of 16, given out in a scrambled order), and a 10-token prompt that arrives
and completes in the second step. The paged cache holds, in every slot, that slot's own
number, so a file shows exactly which slots it was read from. The whole server with a
chunked prompt, against HF, is tests/e2e/server/test_server_chunked_prefill.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters import hidden_states_connector_cpu_writer as cpu_writer
from speccompat.server.adapters.hidden_states_connector_chunked_prefill import (
    CONFIG,
    CONNECTOR,
    ID,
    NEW_ONLY,
    REFUSAL,
    STEP_SLOTS,
)
from speccompat.targets import module_source
from support import adapter_applies, needs_adapter, requires_vllm, state_under_user_apply, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.24.0+ writes chunked prompts whole and accepts chunked "
                        "prefill; before 0.22.0 the connector rewrites the file from its blocks")

BLOCK = 16
LAYER = "model.cache_only_layers.4"
IDS = 2
HIDDEN = 3
LONG = list(range(1000, 1200))  # 200 tokens
SHORT = list(range(2000, 2010))  # 10 tokens
# Blocks as the scheduler gives them out, per step (13 for the long prompt, 1 for the short).
LONG_BLOCKS = ([9, 2, 7, 4], [11, 0, 5, 3], [8, 1, 6, 10], [12])
SHORT_BLOCKS = [13]
# Tokens computed per step: 64 | 54 + 10 | 64 | 18.
STEPS = ((("long", 0, 64),), (("long", 64, 54), ("short", 0, 10)), (("long", 118, 64),),
         (("long", 182, 18),))


def _slots(blocks: list[int], start: int, count: int) -> list[int]:
    every = [b * BLOCK + o for b in blocks for o in range(BLOCK)]
    return every[start:start + count]


def _all_long_blocks() -> list[int]:
    return [b for step in LONG_BLOCKS for b in step]


@pytest.fixture()
def engine_args(tiny_llama: Path, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``vllm serve``'s arguments for the issue's command with a chunked budget. The engine
    arguments load vLLM's general plugins; speccompat's is kept out of this process (it
    would apply every server-path adapter here), so each test applies what it tests."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("SPECCOMPAT_DISABLE", "1")
    args = EngineArgs(
        model=str(tiny_llama), max_model_len=1024, enforce_eager=True,
        enable_chunked_prefill=True, max_num_batched_tokens=64,
        speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                            "draft_model_config": {"hf_config": {
                                "eagle_aux_hidden_state_layer_ids": [1, 4]}}},
        kv_transfer_config=KVTransferConfig(
            kv_connector="ExampleHiddenStatesConnector", kv_role="kv_producer",
            kv_connector_extra_config={"shared_storage_path": str(tmp_path / "hs")}))
    monkeypatch.delenv("SPECCOMPAT_DISABLE")
    yield args


def _apply(*ids: str) -> None:
    wanted = [i for i in ids if adapter_applies(i)[0]]
    report = registry._apply(only=wanted, paths=(ExtractionPath.SERVER,), judge_support=False)
    for i in wanted:
        assert report.state_of(i) is speccompat.State.APPLIED, report


def _connector(vllm_config: Any, role: str) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
    )

    return ExampleHiddenStatesConnector(vllm_config, getattr(KVConnectorRole, role), None)


def _scheduler_output(step: int) -> Any:
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    output = SchedulerOutput.make_empty()
    cached = CachedRequestData.make_empty()
    for req_id, start, count in STEPS[step]:
        output.num_scheduled_tokens[req_id] = count
        blocks = LONG_BLOCKS[step] if req_id == "long" else SHORT_BLOCKS
        if start == 0:
            output.scheduled_new_reqs.append(NewRequestData(
                req_id=req_id, prompt_token_ids=LONG if req_id == "long" else SHORT,
                mm_features=[], sampling_params=None, pooling_params=None,
                block_ids=(list(blocks),), num_computed_tokens=0, lora_request=None))
        else:
            cached.req_ids.append(req_id)
            cached.new_block_ids.append((list(blocks),))
            cached.num_computed_tokens.append(start)
            cached.num_output_tokens.append(0)
    output.scheduled_cached_reqs = cached
    output.total_num_scheduled_tokens = sum(output.num_scheduled_tokens.values())
    return output


def _step_slots(step: int) -> list[int]:
    """The slots the model runner computes for this step's tokens, batch order."""
    slots: list[int] = []
    for req_id, start, count in STEPS[step]:
        blocks = _all_long_blocks() if req_id == "long" else SHORT_BLOCKS
        slots += _slots(blocks, start, count)
    return slots


def _run_steps(vllm_config: Any) -> dict[str, dict[str, Any]]:
    """Every step through the real connector, scheduler side then worker side; what it
    wrote, per request, with the step it was written in."""
    import torch
    from safetensors.torch import load_file
    from vllm.forward_context import ForwardContext, override_forward_context
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionMetadata

    scheduler = _connector(vllm_config, "SCHEDULER")
    worker = _connector(vllm_config, "WORKER")
    worker.cache_layers = [LAYER]  # what register_kv_caches finds in a real engine
    slot = torch.arange(16 * BLOCK, dtype=torch.float32).reshape(16, BLOCK, 1, 1)
    kv = (slot + 1000 * torch.arange(IDS).reshape(1, 1, IDS, 1)).expand(
        16, BLOCK, IDS, HIDDEN).contiguous()
    storage = Path(scheduler._storage_path)
    written: dict[str, dict[str, Any]] = {}
    for step in range(len(STEPS)):
        meta = scheduler.build_connector_meta(_scheduler_output(step))
        worker.bind_connector_metadata(meta)
        slots = torch.tensor(_step_slots(step))
        context = ForwardContext(no_compile_layers={}, attn_metadata={},
                                 slot_mapping={LAYER: slots})
        with override_forward_context(context):
            worker.save_kv_layer(LAYER, kv, CacheOnlyAttentionMetadata(slots))
        worker.wait_for_save()
        worker._executor.shutdown(wait=True)  # the writes of this step are on disk
        worker._executor = type(worker._executor)(max_workers=1)
        worker.clear_connector_metadata()
        for req_id in ("long", "short"):
            path = storage / f"{req_id}.safetensors"
            if path.exists() and req_id not in written:
                written[req_id] = {"step": step, **load_file(str(path))}
                os.rename(path, storage / f"{req_id}.{step}.safetensors")
            elif path.exists():
                raise AssertionError(f"{req_id} written twice (again in step {step})")
    return written


def _expected(slots: list[int]) -> Any:
    import torch

    s = torch.tensor(slots, dtype=torch.float32).reshape(-1, 1, 1)
    return (s + 1000 * torch.arange(IDS).reshape(1, IDS, 1)).expand(len(slots), IDS, HIDDEN)


@vllm_in(">=0.22.0,<0.24.0", "0.24.0 dropped the refusal and reads the request's blocks")
def test_raw_the_connector_reads_the_step_slots_of_new_requests() -> None:
    assert REFUSAL in (module_source(CONFIG) or "")
    source = module_source(CONNECTOR) or ""
    assert STEP_SLOTS in source and NEW_ONLY in source


@vllm_in(">=0.24.0", "0.22.0-0.23.x refuse chunked prefill with the connector")
def test_from_0_24_chunked_prefill_is_accepted_and_the_adapter_not_selected() -> None:
    assert REFUSAL not in (module_source(CONFIG) or "")
    assert STEP_SLOTS not in (module_source(CONNECTOR) or "")
    assert adapter_applies(ID)[0] is False
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.NOT_NEEDED
    finally:
        speccompat.revert()


@applies
def test_raw_vllm_refuses_chunked_prefill_at_start_up(engine_args: Any) -> None:
    with pytest.raises(ValueError, match=REFUSAL + r".*--no-enable-chunked-prefill"):
        engine_args.create_engine_config()


@applies
def test_raw_a_chunked_prompt_is_written_from_its_first_chunk(engine_args: Any) -> None:
    """What the refusal protects against (the refusal itself lifted, the connector not
    adapted): the long prompt's file is written in its first step, with that step's 64
    states under 200 token ids; the short prompt's file holds the long prompt's states."""
    _apply(cpu_writer.ID, ID)
    try:
        vllm_config = engine_args.create_engine_config()
    finally:
        speccompat.revert()
    _apply(cpu_writer.ID)
    try:
        written = _run_steps(vllm_config)
    finally:
        speccompat.revert()
    long, short = written["long"], written["short"]
    assert long["step"] == 0 and long["token_ids"].tolist() == LONG
    assert tuple(long["hidden_states"].shape) == (64, IDS, HIDDEN)
    assert short["token_ids"].tolist() == SHORT
    assert short["hidden_states"].equal(_expected(_slots(_all_long_blocks(), 64, 10)))


@applies
def test_with_it_each_prompt_is_written_whole_once_its_prefill_completes(
        engine_args: Any) -> None:
    _apply(cpu_writer.ID, ID)
    try:
        vllm_config = engine_args.create_engine_config()
        assert vllm_config.scheduler_config.enable_chunked_prefill is True
        assert vllm_config.scheduler_config.max_num_batched_tokens == 64
        written = _run_steps(vllm_config)
    finally:
        speccompat.revert()
    long, short = written["long"], written["short"]
    assert long["step"] == 3 and long["token_ids"].tolist() == LONG
    assert long["hidden_states"].equal(_expected(_slots(_all_long_blocks(), 0, 200)))
    assert short["step"] == 1 and short["token_ids"].tolist() == SHORT
    assert short["hidden_states"].equal(_expected(_slots(SHORT_BLOCKS, 0, 10)))


@applies
def test_user_apply_leaves_it_to_the_plugin() -> None:
    assert state_under_user_apply(ID) is speccompat.State.SKIPPED
