"""vLLM 0.24's ``ExampleHiddenStatesConnector`` rebuilds a finished request's read slots as
``block_ids x self._block_size`` with ``self._block_size = cache_config.block_size``. On a
hybrid verifier (Qwen3.5 / Qwen3-Next: linear attention + full attention) vLLM raises the
global block size to a common multiple while the hidden-states cache group keeps a smaller
block of its own, and ``extract_from_kv_cache`` decodes the slots with the cache's real
block size: the writer reads unwritten slots (all-zero rows) and other tokens' states, with
no error (seen on the H200 with vLLM 0.24.0: 70% zero rows, files cut to whole blocks), or
indexes past the cache at scale.

The connector takes the hidden-states group's own block size: from the ``KVCacheConfig``
it is given (the group whose spec is a ``HiddenStateCacheSpec``, else the connector's own
group lookup), and, once the cache is registered, from the registered buffer's block
dimension, which is what ``extract_from_kv_cache`` divides by. vLLM 0.25.0 reads the
group's spec itself and raises where it differs from the buffer.

vLLM 0.22 and 0.23 set the same ``_block_size`` but never read slots with it: their
``save_kv_layer`` takes the cache-only layer's own slot mapping from the forward context.
vLLM 0.17-0.21 build the slots from ``cache_config.block_size`` too, but their connector
is not ``SupportsHMA``, so vLLM gives it no separate hidden-states group.
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

ID = "vllm.hidden_states_connector_group_block_size"
CONNECTOR = HIDDEN_STATES_CONNECTOR
CLASS = "ExampleHiddenStatesConnector"
# The buggy assignment, the slot rebuild that reads it, and the decode that does not.
GLOBAL_BLOCK_SIZE = "self._block_size = vllm_config.cache_config.block_size"
SLOT_REBUILD = "block_offsets = torch.arange(0, self._block_size"
BUFFER_BLOCK_SIZE = "block_size = kv_cache.shape[1]"

log = logging.getLogger("vllm.speccompat")


def group_block_size(connector: Any, kv_cache_config: Any) -> int | None:
    """The hidden-states group's block size in ``kv_cache_config``, or ``None`` without one."""
    if kv_cache_config is None:
        return None
    from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

    groups = list(kv_cache_config.kv_cache_groups)
    found = [g for g in groups if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
    if len(found) != 1:  # none typed as such, or ambiguous: the connector's own lookup
        index = getattr(connector, "_hs_group_idx", 0)
        found = groups[index:index + 1]
    return int(found[0].kv_cache_spec.block_size) if found else None


def _init(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        own = group_block_size(self, getattr(self, "_kv_cache_config", None))
        if own is not None and own != self._block_size:
            log.info("speccompat: hidden-states cache group block size %d (the engine's "
                     "block size is %d); the connector reads with %d", own, self._block_size,
                     own)
            self._block_size = own

    return __init__


def _register(register: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(register)
    def register_kv_caches(self: Any, kv_caches: dict[str, Any]) -> Any:
        result = register(self, kv_caches)
        cache = getattr(self, "_kv_cache", None)
        if cache is not None and cache.dim() >= 2 and int(cache.shape[1]) != self._block_size:
            log.info("speccompat: the registered hidden-states cache has blocks of %d "
                     "tokens; the connector reads with %d, not %d", int(cache.shape[1]),
                     int(cache.shape[1]), self._block_size)
            self._block_size = int(cache.shape[1])
        return result

    return register_kv_caches


def _probe() -> str | None:
    return require_in_source(CONNECTOR, GLOBAL_BLOCK_SIZE, SLOT_REBUILD, BUFFER_BLOCK_SIZE)


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        connector = getattr(module, CLASS)
        patcher.wrap(connector, "__init__", _init)
        patcher.wrap(connector, "register_kv_caches", _register)

    patcher.on_import(CONNECTOR, on_connector)


ADAPTER = Adapter(
    id=ID,
    summary="ExampleHiddenStatesConnector reads with the hidden-states cache group's own "
    "block size (hybrid verifiers)",
    why="on hybrid verifiers (linear + full attention) vLLM raises cache_config.block_size "
    "above the hidden-states group's block size; the connector rebuilds the read slots with "
    "the larger one and writes all-zero rows and other tokens' states, with no error",
    how="wraps ExampleHiddenStatesConnector.__init__ to take the block size of the "
    "HiddenStateCacheSpec group of its KVCacheConfig, and register_kv_caches to take the "
    "registered cache's block dimension",
    upstream="vLLM 0.24.0: the connector extracts in get_finished from slots rebuilt as "
    "block_ids x cache_config.block_size (0.22-0.23 read the layer's own slot mapping); "
    "fixed in 0.25.0",
    upstream_ref="vLLM PR #46301 (the fix: _find_cache_kv_group_id, _get_cache_block_size; "
    "0.25.0); the slot rebuild came with the asynchronous writer, vLLM PR #43805",
    vllm=spec(">=0.24.0,<0.25.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM < 0.25.0 is no longer supported",
)
