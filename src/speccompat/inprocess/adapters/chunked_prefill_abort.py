"""speculators 0.3.0 aborts every scheduled request after each step, also those whose
prompt was only partly prefilled (chunked prefill when a batch exceeds the token
budget): their remaining tokens are never computed.

The generator's scheduler defers the abort of a request until its whole prompt
has been scheduled, so the loop it already runs finishes the prefill.
"""

from __future__ import annotations

from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, require_in_source
from ...versions import spec
from ...wrappers import wrap_factory

ID = "vllm.chunked_prefill_abort"


def _abort_after_prefill(scheduler: Any) -> Any:
    finish = scheduler.finish_requests

    def finish_requests(request_ids: Any, finished_status: Any) -> Any:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        done = [rid for rid in ids if _prefilled(scheduler.requests.get(rid))]
        return finish(done, finished_status) if done else None

    scheduler.finish_requests = finish_requests
    return scheduler


def _prefilled(request: Any) -> bool:
    return request is None or request.num_computed_tokens >= request.num_prompt_tokens


def _probe() -> str | None:
    return require_in_source(
        GENERATOR, "self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)")


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "Scheduler",
                           lambda original: wrap_factory(original, _abort_after_prefill))




ADAPTER = Adapter(
    id=ID,
    summary="requests are aborted only once their whole prompt was scheduled",
    why="a request whose prompt exceeds one step's token budget is aborted after its first chunk, "
    "so its remaining tokens are never computed and its hidden states are cut short",
    how="wraps the generator's Scheduler so finish_requests leaves requests whose prompt is not "
    "fully computed yet",
    upstream="speculators 0.3.0 generate() loop (fixed in speculators 0.4.0, PR #283); "
    "chunked prefill is on by default in vLLM V1",
    upstream_ref="speculators PR #283 (released in speculators 0.4.0) fixes the generator loop "
    "this adapter fixes for 0.3.0; for vLLM V1's chunked prefill default none found",
    vllm=spec(">=0.10.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
