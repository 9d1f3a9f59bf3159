"""From vLLM 0.11.1 ``execute_model`` only runs the forward; ``sample_tokens`` must follow.

Without it the next ``execute_model`` raises "State error: sample_tokens() must
be called after execute_model() returns None". speculators 0.3.0 only calls
``execute_model``; its view of the executor completes each step.
"""

from __future__ import annotations

from typing import Any

from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import GENERATOR, Proxy, wrap_factory
from ..versions import spec

ID = "vllm.executor.sample_tokens_required"


class SamplingStepExecutor(Proxy):
    """``execute_model`` followed by ``sample_tokens`` when the forward deferred sampling."""

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        output = self.inner.execute_model(scheduler_output, *args, **kwargs)
        if output is None:
            # The generator builds no grammar, so there is no GrammarOutput to pass.
            output = self.unwrapped.sample_tokens(None)
        return output


def _probe() -> str | None:
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    if not hasattr(MultiprocExecutor, "sample_tokens"):
        return "MultiprocExecutor has no sample_tokens"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, SamplingStepExecutor))


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's execute_model steps are completed with sample_tokens",
    upstream="vLLM 0.11.1: execute_model/sample_tokens split (async scheduling rework)",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 calls sample_tokens)",
)
