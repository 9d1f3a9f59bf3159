"""vLLM 0.24-0.30's ``ExampleHiddenStatesConnector.request_finished`` pops the request's
file name with ``self._request_filenames.pop(req_id)``, and that name is recorded only when
the request is first scheduled (``build_connector_meta``). A request that finishes before
it was ever scheduled (its client disconnected or timed out while it waited in the queue)
raises ``KeyError`` inside the scheduler, the engine core dies (``EngineDeadError``), and
every other request on that server fails with it. Seen in the matrix cell vLLM 0.26.0 x
speculators 0.5.0: a client that disconnects from a 1000-token prompt on a busy server
took the server down.

The connector answers such a request as vLLM 0.31.0 does: nothing was computed, so there
is no file to write and no block to hold (``False, None``). That answer frees the request at
once, but the worker-side ``get_finished`` of these releases reports *every* finished request
as done sending, tracked or not, and the scheduler asserts that each one it is told of is
still held (``_update_from_kv_xfer_finished``): the request's report one step later killed
the engine with ``AssertionError`` instead (matrix cell vLLM 0.28.0 x speculators 0.5.0,
2026-12-05). vLLM 0.31.0 fixed both halves ("Only report requests we actually tracked for
sending"); here the scheduler-side connector drops the report of each request it answered so
(``update_connector_output``, which the scheduler calls before it reads the reports).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import HIDDEN_STATES_CONNECTOR, require_in_source
from ...versions import spec

ID = "vllm.hidden_states_connector_abort_before_schedule"
CONNECTOR = HIDDEN_STATES_CONNECTOR
CLASS = "ExampleHiddenStatesConnector"
# The pop without a default, and where the name is recorded.
POP = "filename = self._request_filenames.pop(req_id)"
RECORD = "self._request_filenames[new_req.req_id] = filename"
# The worker reports a finished request without a copy in flight as done sending...
REPORTS_UNTRACKED = "if event is None or event.query():"
# ...and the scheduler hands the reports to its connector before it asserts on them.
SCHEDULER = "vllm.v1.core.sched.scheduler"
HANDS_REPORTS = "self.connector.update_connector_output(kv_connector_output)"
# Requests answered (False, None), whose report the scheduler must not see.
UNSCHEDULED = "_speccompat_unscheduled_req_ids"

log = logging.getLogger("vllm.speccompat")


def _request_finished(finished: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(finished)
    def request_finished(self: Any, request: Any, block_ids: list[int]) -> Any:
        if request.request_id not in self._request_filenames:
            log.info("speccompat: request %s finished before it was scheduled; no hidden "
                     "states to write", request.request_id)
            self.__dict__.setdefault(UNSCHEDULED, set()).add(request.request_id)
            return False, None
        return finished(self, request, block_ids)

    return request_finished


def _update_connector_output(update: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(update)
    def update_connector_output(self: Any, connector_output: Any) -> Any:
        unscheduled: set[str] | None = self.__dict__.get(UNSCHEDULED)
        sending = connector_output.finished_sending
        if unscheduled and sending and (freed := unscheduled & sending):
            # Already freed: the scheduler would assert that it still holds them.
            connector_output.finished_sending = (sending - freed) or None
            unscheduled -= freed
        return update(self, connector_output)

    return update_connector_output


def _probe() -> str | None:
    return (require_in_source(CONNECTOR, POP, RECORD, REPORTS_UNTRACKED)
            or require_in_source(SCHEDULER, HANDS_REPORTS))


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        connector = getattr(module, CLASS)
        patcher.wrap(connector, "request_finished", _request_finished)
        patcher.wrap(connector, "update_connector_output", _update_connector_output)

    patcher.on_import(CONNECTOR, on_connector)


ADAPTER = Adapter(
    id=ID,
    summary="a request aborted before it was scheduled no longer kills the engine "
    "(ExampleHiddenStatesConnector.request_finished)",
    why="request_finished pops the request's file name without a default, and the name is "
    "recorded only when the request is first scheduled: a client that disconnects or times "
    "out while its request waits raises KeyError in the scheduler and the whole server dies",
    how="wraps ExampleHiddenStatesConnector.request_finished: a request without a recorded "
    "file name returns (False, None), as vLLM 0.31.0 does; and its update_connector_output: "
    "the worker's later 'done sending' for such a request, already freed, is dropped before "
    "the scheduler asserts that it still holds it",
    upstream="vLLM 0.24.0 moved the write to request_finished/get_finished with a bare "
    "dict pop, and get_finished reports every finished request as done sending; 0.31.0 "
    "pops with a default, returns (False, None) and reports only requests it tracked",
    upstream_ref="none found: vLLM 0.31.0's source, the comment 'Request was aborted before "
    "it was ever scheduled'",
    vllm=spec(">=0.24.0,<0.31.0"),
    speculators=None,
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM < 0.31.0 is no longer supported",
)
