"""vLLM 0.24-0.30's ExampleHiddenStatesConnector.request_finished pops the request's file
name without a default; a request that finishes before it was ever scheduled (its client
went away while it waited) raises KeyError in the scheduler and the engine dies. Found in
the matrix cell vLLM 0.26.0 x speculators 0.5.0 (test_server_bad_input's disconnect test
on a busy server: "KeyError: 'cmpl-...'" in request_finished, EngineDeadError).

The real scheduler-side connector (``connector_drive``'s engine config) and a real
``vllm.v1.request.Request``; a scheduled request's file name is recorded where
``build_connector_meta`` records it (the probed line). A server-level reproduction
(one sequence at a time, a second request sent and dropped while the first prefills) did
not abort before scheduling on an idle machine; the death was seen under load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import connector_drive as drive
import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.hidden_states_connector_abort_before_schedule import ID, POP
from speccompat.targets import module_source
from support import make_request, needs_adapter, requires_vllm, vllm_in

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

