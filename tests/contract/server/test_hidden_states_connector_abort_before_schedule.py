"""vLLM 0.24-0.30's ExampleHiddenStatesConnector.request_finished pops the request's file
name without a default; a request that finishes before it was ever scheduled (its client
went away while it waited) raises KeyError in the scheduler and the engine dies. Found in
the matrix cell vLLM 0.26.0 x speculators 0.5.0 (test_server_bad_input's disconnect test
on a busy server: "KeyError: 'cmpl-...'" in request_finished, EngineDeadError).

The real scheduler-side connector (``connector_drive``'s engine config) and a real
``vllm.v1.request.Request``; a scheduled request's file name is recorded where
``build_connector_meta`` records it (the probed line). A server-level reproduction
(one sequence at a time, a second request sent and dropped while the first prefills) did
not abort before scheduling on an idle machine; the death was seen under load.

The second half (matrix cell vLLM 0.28.0 x speculators 0.5.0, the same disconnect test): the
request so freed is reported "done sending" by the worker one step later, and the scheduler
asserts that it still holds it (``AssertionError`` in ``_update_from_kv_xfer_finished``,
EngineDeadError). Pinned here: the worker's report of an untracked request, the scheduler
handing reports to its connector before it asserts, the report dropped there, and one real
in-process engine (CPU) that steps on after a request is aborted before its first step."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import connector_drive as drive
import speccompat
from speccompat import patching, registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.hidden_states_connector_abort_before_schedule import (
    HANDS_REPORTS,
    ID,
    POP,
    SCHEDULER,
)
from speccompat.targets import module_source
from support import (
    in_fresh_process,
    make_request,
    needs_adapter,
    requires_vllm,
    source_text,
    vllm_in,
)

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.31.0 on pops with a default; before 0.24.0 the "
                            "connector pops with a default too")


@pytest.fixture(scope="module")
def setup(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with drive.hybrid_setup(tiny_llama, tmp_path_factory.mktemp("hs")) as hybrid:
        yield hybrid


def _scheduler_connector(setup: Any) -> Any:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    with set_current_vllm_config(setup.config):
        return drive.connector_module().ExampleHiddenStatesConnector(
            setup.config, KVConnectorRole.SCHEDULER, setup.kv_cache_config)


@pytest.fixture
def applied() -> Iterator[None]:
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    assert report.state_of(ID) is speccompat.State.APPLIED, report
    try:
        yield
    finally:
        speccompat.revert()


@vllm_in(">=0.24.0,<0.31.0", "the bare pop is in 0.24.0-0.30.x")
def test_raw_an_unscheduled_request_raises_in_the_scheduler(setup: Any) -> None:
    assert POP in (module_source(drive.CONNECTOR) or "")
    connector = _scheduler_connector(setup)
    with pytest.raises(KeyError, match="never-scheduled"):
        connector.request_finished(make_request("never-scheduled", 12), [1])


@applies
def test_normalized_an_unscheduled_request_has_nothing_to_write(setup: Any,
                                                                applied: None) -> None:
    connector = _scheduler_connector(setup)
    assert connector.request_finished(make_request("never-scheduled", 12), [1]) == (
        False, None)
    assert "never-scheduled" not in connector._pending_saves


@applies
def test_normalized_a_scheduled_request_is_saved_as_before(setup: Any, applied: None,
                                                           tmp_path: Path) -> None:
    connector = _scheduler_connector(setup)
    path = str(tmp_path / "req-1.safetensors")
    connector._request_filenames["req-1"] = path  # what build_connector_meta records
    delay, params = connector.request_finished(make_request("req-1", 12), [3])
    assert delay is True and params == {"hidden_states_path": path}
    assert connector._pending_saves["req-1"].block_ids == [3]


@applies
def test_fails_without_the_adapter(setup: Any) -> None:
    connector = _scheduler_connector(setup)
    with pytest.raises(KeyError):
        connector.request_finished(make_request("never-scheduled", 12), [1])


@vllm_in(">=0.31.0", "vLLM 0.31.0 pops with a default")
def test_fixed_upstream_not_selected(setup: Any) -> None:
    from speccompat.server.adapters.hidden_states_connector_abort_before_schedule import ADAPTER

    assert not ADAPTER.wants(speccompat.detect())[0]
    connector = _scheduler_connector(setup)
    assert connector.request_finished(make_request("never-scheduled", 12), [1]) == (
        False, None)


@vllm_in(">=0.24.0,<0.31.0", "0.31.0 reports only the requests it tracked")
def test_raw_the_worker_reports_an_untracked_request_as_sent(setup: Any) -> None:
    worker = drive.make_connector(setup)
    done, _ = worker.get_finished({"never-scheduled"})
    assert done == {"never-scheduled"}


@vllm_in(">=0.24.0,<0.31.0", "where the adapter drops reports")
def test_the_scheduler_hands_reports_to_the_connector_before_it_asserts() -> None:
    text = source_text(SCHEDULER, "Scheduler._update_from_kv_xfer_finished")
    loop = text.index("for req_id in kv_connector_output.finished_sending")
    assert text.index(HANDS_REPORTS) < loop
    assert "assert req_id in self.requests" in text[loop:]


@applies
def test_normalized_the_freed_request_is_not_reported_to_the_scheduler(setup: Any,
                                                                       applied: None) -> None:
    from vllm.v1.outputs import KVConnectorOutput

    scheduler = _scheduler_connector(setup)
    worker = drive.make_connector(setup)
    assert scheduler.request_finished(make_request("never-scheduled", 12), [1]) == (
        False, None)
    done, _ = worker.get_finished({"never-scheduled", "held"})
    output = KVConnectorOutput(finished_sending=done)
    scheduler.update_connector_output(output)
    assert output.finished_sending == {"held"}  # a request the scheduler still holds
    output = KVConnectorOutput(finished_sending={"never-scheduled"})
    scheduler.update_connector_output(output)  # dropped once: forgotten after that
    assert output.finished_sending == {"never-scheduled"}


@applies
def test_normalized_the_engine_outlives_an_abort_before_the_first_step(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """One engine, core and worker in this process (CPU): "dropped" is aborted while it
    waits, "kept" runs. Without the second half the first step fails the scheduler's
    assertion; with it the engine steps on and "kept" gets its file."""
    import serving

    serving.skip_unless_the_cpu_build_serves()  # e.g. 0.24's: no speculative engine starts
    if not in_fresh_process(request):
        return
    tiny_llama = request.getfixturevalue("tiny_llama")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # a process of its own: no restore
    from vllm import LLM, SamplingParams

    import tiny_models

    llm = LLM(model=str(tiny_llama), max_model_len=256, enforce_eager=True,
              speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                  "draft_model_config": {"hf_config": {
                                      "eagle_aux_hidden_state_layer_ids": [1, 2]}}},
              kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector",
                                  "kv_role": "kv_producer", "kv_connector_extra_config": {
                                      "shared_storage_path": str(tmp_path)}})
    assert ID in patching.applied(), patching.applied()  # the plugin applied it
    engine = llm.llm_engine
    dropped, kept = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [40, 24], seed=2)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    engine.add_request("dropped", {"prompt_token_ids": dropped}, params)
    engine.abort_request(["dropped"])
    engine.add_request("kept", {"prompt_token_ids": kept}, params)
    finished = []
    for _ in range(20):
        finished += [out for out in engine.step() if out.finished]
        if not engine.has_unfinished_requests():
            break
    for _ in range(3):  # the steps that report "kept" sent and free its blocks
        engine.step()
    assert [out.request_id for out in finished] == ["kept"], finished
    path = Path(finished[0].kv_transfer_params["hidden_states_path"])
    serving.wait_until_written(path)
    assert path.exists()
