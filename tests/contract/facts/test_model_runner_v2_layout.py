"""Model Runner V2's step layout, as speccompat's hook capture reads it (capture.py).

V2 (vLLM 0.12.0 opt-in; the default on CUDA per architecture from 0.22.0 and for every
model from 0.29.0) keeps no ``input_batch``. Each step's rows are laid out as the
``InputBatch`` its ``prepare_inputs`` returns says, in V2's own order (up to 0.25, decode
first and then prefill: not the scheduler's). The capture tells the runners apart by
``input_batch``, wraps ``prepare_inputs`` on the runner instance, reads ``req_ids`` and
``num_scheduled_tokens`` from its result (checked against ``query_start_loc_np``, the rows
attention reads), and lets ``execute_model(dummy_run=True)``
(warm-up, profiling) through. vLLM's CPU build never picks V2 (no Triton backend), so
on CPU this source contract is what checks it on every release; tests/gpu runs it.
"""

from __future__ import annotations

import re

from speccompat.targets import module_source, source_def
from support import requires_vllm, vllm_in

pytestmark = [requires_vllm, vllm_in(">=0.12.0,<0.34.0", "Model Runner V2 ships from vLLM "
                                     "0.12.0; from 0.34.0 apply() refuses the in-process "
                                     "path (no V1 runner), so no capture reads this layout")]
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner"
STEP_BATCH = "vllm.v1.worker.gpu.input_batch"


def test_only_the_v1_runner_keeps_an_input_batch() -> None:
    v1, v2 = module_source(RUNNER_V1), module_source(RUNNER_V2)
    assert v1 is not None and v2 is not None
    assert "self.input_batch = InputBatch(" in v1
    assert "self.input_batch =" not in v2
    assert source_def(RUNNER_V2, "GPUModelRunner.prepare_inputs") is not None


def test_execute_model_prepares_each_step_through_prepare_inputs() -> None:
    execute = source_def(RUNNER_V2, "GPUModelRunner.execute_model")
    assert execute is not None
    assert "self.prepare_inputs(" in execute.text
    # Warm-up and profiling come through execute_model too; the capture lets them pass.
    assert "dummy_run" in execute.params


def test_prepare_inputs_returns_the_layout_the_capture_reads() -> None:
    prepare = source_def(RUNNER_V2, "GPUModelRunner.prepare_inputs")
    assert prepare is not None
    built = prepare.text[prepare.text.rindex("InputBatch("):]
    assert "req_ids=req_ids" in built and "num_scheduled_tokens=" in built
    assert "query_start_loc_np=query_start_loc_np" in built
    source = module_source(STEP_BATCH)
    assert source is not None
    found = re.search(r"^class InputBatch\b.*?(?=^\S)", source, re.S | re.M)
    assert found is not None
    for field in ("req_ids", "num_scheduled_tokens", "query_start_loc_np"):
        assert re.search(rf"^    {field}:", found.group(0), re.M), field
