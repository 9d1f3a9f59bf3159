"""vLLM 0.22.0-0.23.x's ``ExampleHiddenStatesConnector`` saves a request once, in the step it
is first scheduled, from that step's slot mapping: a prompt cut into chunks (chunked
prefill, on by default for ``vllm serve``) would get a file holding its first chunk under
the whole prompt's token ids. vLLM refuses the combination at start-up instead
(``ExampleHiddenStatesConnector does not support chunked prefill``, a ``ValueError`` from
``VllmConfig``), so the issue's plain ``vllm serve`` command does not start on these
releases unless the user also passes ``--no-enable-chunked-prefill`` (and a
``--max-num-batched-tokens`` at least ``--max-model-len``). 0.24.0 reworked the connector
to read the whole prompt from its blocks, and dropped the refusal.

With this adapter the connector writes each request once, in the step its prefill
completes, and its upstream writer reads the slots of all the request's blocks (tracked
from the scheduler's block ids, as the model runner tracks them) instead of that step's
slots alone; the refusal is then lifted. Everything else (the CUDA copy stream, the lock
file, the thread pool, ``get_finished``) stays upstream's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import HIDDEN_STATES_CONNECTOR, require_in_source
from ...versions import spec

ID = "vllm.hidden_states_connector_chunked_prefill"
CONNECTOR = HIDDEN_STATES_CONNECTOR
CONFIG = "vllm.config.vllm"
NAME = "ExampleHiddenStatesConnector"
REFUSAL = "ExampleHiddenStatesConnector does not support chunked prefill"
# What the writer reads: the slots of the step it runs in.
STEP_SLOTS = "slot_mapping = get_forward_context().slot_mapping[layer_name]"
# Which requests it writes: those scheduled for the first time in this step.
NEW_ONLY = "for new_req in scheduler_output.scheduled_new_reqs:"
# The metadata attribute that carries, per request written this step, its block ids.
BLOCKS = "speccompat_block_ids"
# The name of vLLM's cache-only layer (ExtractHiddenStatesModel.cache_only_layers).
CACHE_ONLY = "cache_only_layers"


@dataclass
class _Prefill:
    """A request whose prompt is not fully computed yet: upstream's ``ReqMeta`` for it (its
    file name and prompt token ids), and its blocks in the hidden-states group."""

    meta: Any
    prompt_len: int
    blocks: list[int] = field(default_factory=list)


def _group(connector: Any) -> int:
    """The KV cache group that holds the cache-only layer (0 where there is one group)."""
    config = getattr(connector, "_kv_cache_config", None)
    for index, group in enumerate(getattr(config, "kv_cache_groups", None) or ()):
        if any(CACHE_ONLY in name for name in group.layer_names):
            return index
    return 0


def _state(connector: Any) -> dict[str, _Prefill]:
    state: dict[str, _Prefill] | None = vars(connector).get("_speccompat_prefills")
    if state is None:
        state = connector._speccompat_prefills = {}
    return state


def _build_connector_meta(build: Callable[..., Any]) -> Callable[..., Any]:
    """The metadata lists a request in the step its prefill completes (not the step it
    arrives), with all its blocks."""

    @functools.wraps(build)
    def build_connector_meta(self: Any, scheduler_output: Any) -> Any:
        meta = build(self, scheduler_output)  # upstream's: file names, one ReqMeta per arrival
        prefills = _state(self)
        group = _group(self)
        arrived = {request.req_id: request for request in meta.requests}
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in arrived:
                prefills[new.req_id] = _Prefill(arrived[new.req_id],
                                                len(new.prompt_token_ids or ()),
                                                list(new.block_ids[group]))
                computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for at, req_id in enumerate(cached.req_ids):
            prefill = prefills.get(req_id)
            if prefill is None:
                continue
            new_blocks = cached.new_block_ids[at]
            if req_id in cached.resumed_req_ids:  # as the model runner does: all blocks anew
                prefill.blocks = list(new_blocks[group]) if new_blocks is not None else []
            elif new_blocks is not None:
                prefill.blocks.extend(new_blocks[group])
            computed[req_id] = cached.num_computed_tokens[at]
        done = [req_id for req_id, before in computed.items()
                if before + scheduler_output.num_scheduled_tokens.get(req_id, 0)
                >= prefills[req_id].prompt_len]
        meta.requests = [prefills[req_id].meta for req_id in done]
        setattr(meta, BLOCKS, {req_id: prefills.pop(req_id).blocks for req_id in done})
        return meta

    return build_connector_meta


def _request_finished(finished: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(finished)
    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        _state(self).pop(request.request_id, None)  # aborted before its prefill completed
        return finished(self, request, block_ids)

    return request_finished


def _whole_prompt_slots(meta: Any, kv_layer: Any) -> Any:
    """The slots of every listed request's prompt, in the order the writer walks them."""
    import torch

    block_size = kv_layer.shape[1]  # as extract_from_kv_cache reads the paged cache
    offsets = torch.arange(block_size, dtype=torch.long)
    slots = []
    for request in meta.requests:
        blocks = torch.tensor(getattr(meta, BLOCKS)[request.req_id], dtype=torch.long)
        every = (blocks.reshape(-1, 1) * block_size + offsets.reshape(1, -1)).flatten()
        slots.append(every[: request.token_ids.shape[0]])
    return torch.cat(slots).to(kv_layer.device)


def _save_kv_layer(module: ModuleType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(save: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(save)
        def save_kv_layer(self: Any, layer_name: str, kv_layer: Any, attn_metadata: Any,
                          **kwargs: Any) -> Any:
            meta: Any = self._get_connector_metadata() if self.has_connector_metadata() else None
            context = module.get_forward_context()
            step = context.slot_mapping
            if (layer_name not in self.cache_layers or not hasattr(meta, BLOCKS)
                    or not meta.requests or not isinstance(step, dict)):
                return save(self, layer_name, kv_layer, attn_metadata, **kwargs)
            # The upstream writer, reading the whole prompts' slots instead of this step's.
            context.slot_mapping = {**step, layer_name: _whole_prompt_slots(meta, kv_layer)}
            try:
                return save(self, layer_name, kv_layer, attn_metadata, **kwargs)
            finally:
                context.slot_mapping = step

        return save_kv_layer

    return wrap


def _post_init_kv_transfer_config(check: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's refusal, for this connector only, left out: it writes chunked prompts whole."""

    @functools.wraps(check)
    def _post_init_kv_transfer_config(self: Any) -> Any:
        transfer, scheduler = self.kv_transfer_config, self.scheduler_config
        if (getattr(transfer, "kv_connector", None) != NAME
                or not scheduler.enable_chunked_prefill):
            return check(self)
        scheduler.enable_chunked_prefill = False
        try:
            return check(self)
        finally:
            scheduler.enable_chunked_prefill = True

    return _post_init_kv_transfer_config


def _probe() -> str | None:
    return (require_in_source(CONNECTOR, STEP_SLOTS, NEW_ONLY, "def request_finished(")
            or require_in_source(CONFIG, REFUSAL, "def _post_init_kv_transfer_config(self)"))


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        connector = getattr(module, NAME)
        patcher.wrap(connector, "build_connector_meta", _build_connector_meta)
        patcher.wrap(connector, "request_finished", _request_finished)
        patcher.wrap(connector, "save_kv_layer", _save_kv_layer(module))

    patcher.on_import(CONNECTOR, on_connector)
    patcher.on_import(CONFIG, lambda module: patcher.wrap(
        module.VllmConfig, "_post_init_kv_transfer_config", _post_init_kv_transfer_config))


ADAPTER = Adapter(
    id=ID,
    summary="ExampleHiddenStatesConnector writes a chunked prompt whole, once its prefill "
    "completes, and vLLM accepts chunked prefill with it",
    why="vLLM 0.22-0.23's connector writes a request from the slots of the step it arrives "
    "in, so it refuses chunked prefill at start-up, which vllm serve turns on by default: "
    "the plain extract_hidden_states command does not start",
    how="the scheduler-side metadata lists a request in the step its prefill completes, with "
    "all its blocks; save_kv_layer hands upstream's writer those blocks' slots; "
    "VllmConfig's refusal is skipped for this connector",
    upstream="vLLM 0.22.0: the connector's asynchronous writer saves new requests from the "
    "step's slot mapping and VllmConfig refuses chunked prefill; vLLM 0.24.0 extracts from "
    "the request's blocks when it finishes and accepts chunked prefill",
    upstream_ref="none found: the refusal is in the 0.22.0-0.23.0 wheels' config/vllm.py "
    "(_post_init_kv_transfer_config) and is gone from 0.24.0's, whose connector gained "
    "PendingSave and _submit_async_write",
    vllm=spec(">=0.22.0,<0.24.0"),
    speculators=None,
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.23 is no longer supported (0.24.0 writes chunked prompts whole)",
)
