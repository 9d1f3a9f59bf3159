"""From vLLM 0.27.0 ``Executor.initialize_from_config`` only sets up the KV cache; the
engine calls the new ``Executor.compile_or_warm_up_model()`` itself. speculators 0.3.0
and 0.4.0 build their executor by hand and call only ``initialize_from_config``, so
the workers never warm up (kernels, sampler, compilation): silently slower first
batches and allocations vLLM did not plan for.

The generator's view of the executor warms up right after initialising, as the
engine does.
"""

from __future__ import annotations

from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, require_in_source, source_def
from ...versions import spec
from ...wrappers import Proxy, wrap_factory

ID = "vllm.warm_up_not_in_initialize"


class WarmingUpExecutor(Proxy):
    def initialize_from_config(self, *args: Any, **kwargs: Any) -> Any:
        result = self.inner.initialize_from_config(*args, **kwargs)
        self.unwrapped.compile_or_warm_up_model()
        return result


def _probe() -> str | None:
    executor = "vllm.v1.executor.abstract"  # read, not imported
    if source_def(executor, "Executor.compile_or_warm_up_model") is None:
        return "Executor has no compile_or_warm_up_model"
    initialize = source_def(executor, "Executor.initialize_from_config")
    if initialize is None or "compile_or_warm_up_model" in initialize.text:
        return "Executor.initialize_from_config still warms up"
    return require_in_source(GENERATOR, ".initialize_from_config(")


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, WarmingUpExecutor))


ADAPTER = Adapter(
    id=ID,
    summary="the generator's executor warms its workers up after initialize_from_config, as "
    "vLLM's engine does",
    why="without warm-up the first batches run unwarmed kernels and unplanned allocations",
    how="wraps the generator's MultiprocExecutor in a view that calls compile_or_warm_up_model() "
    "right after initialize_from_config",
    upstream="vLLM 0.27.0: initialize_from_config no longer calls compile_or_warm_up_model; "
    "EngineCore calls Executor.compile_or_warm_up_model()",
    upstream_ref="none found: initialize_from_config first leaves the warm-up to EngineCore in "
    "the vLLM 0.27.0 wheel; no PR for it was located",
    vllm=spec(">=0.27.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
