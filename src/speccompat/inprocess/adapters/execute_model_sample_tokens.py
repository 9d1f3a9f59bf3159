"""From vLLM 0.11.1 ``execute_model`` only runs the forward; ``sample_tokens`` must follow.

Without it the next ``execute_model`` raises "State error: sample_tokens() must
be called after execute_model() returns None". speculators 0.3.0 only calls
``execute_model``; its view of the executor completes each step. speculators
0.4.0 calls ``sample_tokens(model_output)`` after every step, which vLLM 0.11.0's
executor does not have: its ``execute_model`` already sampled, so the view hands
that output back.
"""

from __future__ import annotations

from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, source_def
from ...versions import spec
from ...wrappers import Proxy, wrap_factory

ID = "vllm.execute_model_sample_tokens"
ID_V04 = "vllm.execute_model_sample_tokens.speculators_0_4"


class SamplingStepExecutor(Proxy):
    """``execute_model`` followed by ``sample_tokens`` when the forward deferred sampling."""

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        output = self.inner.execute_model(scheduler_output, *args, **kwargs)
        if output is None:
            # The generator builds no grammar, so there is no GrammarOutput to pass.
            output = self.unwrapped.sample_tokens(None)
        return output


class SampledStepExecutor(Proxy):
    """``sample_tokens`` for an executor whose ``execute_model`` returns the sampled output."""

    def sample_tokens(self, model_output: Any, *args: Any, **kwargs: Any) -> Any:
        return model_output  # execute_model sampled already; nothing is left to run


def _has_sample_tokens() -> bool:
    # Read, not imported: importing the executor module costs seconds in apply().
    return source_def("vllm.v1.executor.multiproc_executor",
                      "MultiprocExecutor.sample_tokens") is not None


def _probe() -> str | None:
    return None if _has_sample_tokens() else "MultiprocExecutor has no sample_tokens"


def _probe_v04() -> str | None:
    return "MultiprocExecutor has sample_tokens" if _has_sample_tokens() else None


def _patch_v04(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, SampledStepExecutor))


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, SamplingStepExecutor))


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's execute_model steps are completed with sample_tokens",
    why="without sample_tokens the next execute_model raises \"State error: sample_tokens() must "
    "be called after execute_model() returns None\"",
    how="wraps the generator's MultiprocExecutor in a view whose execute_model calls "
    "sample_tokens(None) when the forward returned None",
    upstream="vLLM 0.11.1: execute_model/sample_tokens split (async scheduling rework)",
    upstream_ref="vLLM PR #26866 \"[Core] Async scheduling + structured outputs compatibility\" "
    "(in 0.11.1)",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 calls sample_tokens)",
)

ADAPTER_V04 = Adapter(
    id=ID_V04,
    summary="speculators 0.4.0's sample_tokens(model_output) after each step returns the "
    "output vLLM 0.11.0's execute_model already sampled",
    why="speculators 0.4.0 calls sample_tokens(model_output) after each step, which vLLM 0.11.0's "
    "executor does not have (AttributeError)",
    how="wraps the generator's MultiprocExecutor in a view whose sample_tokens returns the output "
    "execute_model already sampled",
    upstream="vLLM 0.11.1: execute_model/sample_tokens split; speculators 0.4.0 calls both",
    upstream_ref="vLLM PR #26866 \"[Core] Async scheduling + structured outputs compatibility\" "
    "(in 0.11.1), which speculators 0.4.0 was written for",
    vllm=spec("<0.11.1"),
    speculators=spec("==0.4.*"),
    side=Side.DRIVER,
    probe=_probe_v04,
    patch=_patch_v04,
    remove_when="vLLM 0.11.0 is no longer supported with speculators 0.4.0",
)
