"""From vLLM 0.29.0 the KV cache layout is resolved once by the engine core
(``resolve_kv_cache_layout`` over what every worker supports, then
``set_kv_cache_layout`` on the workers) before anything reads it; until then
``CacheConfig.get_resolved_kv_cache_layout()`` raises "KV cache layout has not been
resolved yet". speculators 0.3.0 and 0.4.0 build their executor without an engine
core, so ``get_kv_cache_config_from_groups`` raises in the generator's constructor.

Right after the generator builds its executor, the layout is resolved and handed to
the workers exactly as the engine core does it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, require_in_source
from ...versions import spec

ID = "vllm.kv_cache_layout_resolution"
RESOLVER = "vllm.v1.attention.backends.utils"


def resolve_like_the_engine(executor: Any) -> None:
    """``EngineCore._initialize_kv_caches``' resolution step, on a hand-built executor."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    real = getattr(executor, "unwrapped", executor)
    vllm_config = real.vllm_config
    if vllm_config.cache_config.kv_cache_layout is not None:
        return  # set by the user (or already resolved): resolution would keep it anyway
    specs = [s for per_worker in real.get_kv_cache_specs() for s in per_worker.values()]
    layout = resolve_kv_cache_layout(vllm_config, real.get_supported_kv_cache_layouts(), specs)
    real.set_kv_cache_layout(layout.name)


def resolving_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        executor = original(*args, **kwargs)
        resolve_like_the_engine(executor)
        return executor

    build.__name__ = getattr(original, "__name__", "factory")
    build.__qualname__ = getattr(original, "__qualname__", build.__name__)
    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


def _probe() -> str | None:
    return (require_in_source(RESOLVER, "def resolve_kv_cache_layout(")
            or require_in_source("vllm.config.cache", "def get_resolved_kv_cache_layout(")
            or require_in_source(GENERATOR, "MultiprocExecutor(",
                                 "get_kv_cache_config_from_groups("))


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor", resolving_factory)


ADAPTER = Adapter(
    id=ID,
    summary="the generator's executor gets its KV cache layout resolved and published to the "
    "workers, as vLLM's engine core does",
    why="without it the generator's constructor raises \"KV cache layout has not been resolved "
    "yet\" in get_kv_cache_config_from_groups",
    how="wraps the generator's MultiprocExecutor factory to resolve the layout "
    "(resolve_kv_cache_layout) and set it on the workers right after building it",
    upstream="vLLM 0.29.0: the engine core resolves the KV cache layout once "
    "(resolve_kv_cache_layout, set_kv_cache_layout); reading it earlier raises",
    upstream_ref="none found: the engine core first resolves the layout in the vLLM 0.29.0 wheel; "
    "no PR for it was located",
    vllm=spec(">=0.29.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
