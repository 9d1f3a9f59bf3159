"""The V1 model runner, whose absence makes ``apply()`` refuse the in-process path.

speculators 0.3/0.4's generator builds V1 runner pieces itself. vLLM 0.34.0 deleted
``vllm/v1/worker/gpu_model_runner.py`` (with ``gpu_input_batch.py``, ``cpu_model_runner.py``,
``kv_connector_model_runner_mixin.py`` and ``vllm/v1/spec_decode/extract_hidden_states.py``,
read from the 0.33.0 and 0.34.0 wheels' file lists): Model Runner V2 is the only runner there.
``registry.in_process_refusal`` decides by reading the installed files; this pins that every
vLLM up to 0.33 has the module, so the refusal never meets a release it was not meant for.
"""

from __future__ import annotations

import pytest

import speccompat
from speccompat import registry
from speccompat.errors import V1RunnerRemovedError
from speccompat.record import ExtractionPath
from speccompat.registry import V1_RUNNER
from speccompat.targets import module_source
from support import requires_vllm, vllm_in

pytestmark = [requires_vllm]


def test_apply_is_not_refused_where_the_v1_runner_is_installed() -> None:
    if module_source(V1_RUNNER) is None:
        pytest.skip(f"{V1_RUNNER} is not installed here: the refusal's own test covers it")
    assert registry.in_process_refusal(speccompat.detect()) is None
    try:
        # The public apply() with nothing selected: judged as a user's call, patches nothing.
        speccompat.apply(only=())
    except V1RunnerRemovedError as error:  # pragma: no cover - the failure being pinned
        pytest.fail(f"apply() refused where {V1_RUNNER} is installed: {error}")
    finally:
        speccompat.revert()


@vllm_in("<0.34", "vLLM 0.34.0 deleted the V1 model runners")
def test_every_vllm_up_to_0_33_has_the_v1_runner() -> None:
    source = module_source(V1_RUNNER)
    assert source is not None
    assert "class GPUModelRunner" in source
    assert module_source("vllm.v1.worker.gpu_input_batch") is not None


@vllm_in(">=0.34", "the V1 model runner is there up to vLLM 0.33.x")
def test_apply_refuses_where_the_v1_runner_is_gone() -> None:
    assert module_source(V1_RUNNER) is None
    assert module_source("vllm.v1.worker.gpu.model_runner") is not None  # Model Runner V2
    with pytest.raises(V1RunnerRemovedError, match=r"up to 0\.33\.x") as caught:
        speccompat.apply()
    assert V1_RUNNER in str(caught.value) and "vllm serve" in str(caught.value)
    assert speccompat.active() == ()
    # The plugin's server path is not refused.
    report = registry._apply(paths=(ExtractionPath.SERVER,), judge_support=False, only=())
    assert report.outcomes
    speccompat.revert()
