"""capture.py: where the decoder layers are, which rows of a step belong to which request
under Model Runner V2, and the runner patches that ``close`` undoes.

The layout comes from the step's ``InputBatch`` (vLLM's, duck-typed here: the capture
reads three fields); the model runner and torch are not needed to compute it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from speccompat import AdapterError, CorruptCaptureError
from speccompat.inprocess.capture import LayerCapture, decoder_stack
from speccompat.patching import Patcher, patched_by

ADAPTER = "vllm.model_forward_drift"


def capture_with(batch: SimpleNamespace) -> LayerCapture:
    # A runner without input_batch but with prepare_inputs is Model Runner V2.
    capture = LayerCapture.__new__(LayerCapture)
    capture.runner = SimpleNamespace(prepare_inputs=lambda *a: batch)
    capture.prepared, capture.adapter = batch, ADAPTER
    return capture


def test_v2_rows_follow_the_step_batch_order_not_the_scheduler_order() -> None:
    # V2 puts its own order on the step (decode first, up to 0.25); padding past the end.
    batch = SimpleNamespace(req_ids=["b", "a"], num_scheduled_tokens=[3, 5, 0],
                            query_start_loc_np=[0, 3, 8, 8])
    assert capture_with(batch)._batch_layout() == [("b", 0, 3), ("a", 3, 5)]


def test_v2_counts_that_are_not_the_rows_attention_reads_raise() -> None:
    # num_scheduled_tokens is an upper bound when draft tokens are scheduled.
    batch = SimpleNamespace(req_ids=["a", "b"], num_scheduled_tokens=[4, 4],
                            query_start_loc_np=[0, 3, 6])
    with pytest.raises(CorruptCaptureError, match=r"rows \[4, 4\].*query_start_loc \[0, 3, 6\]"):
        capture_with(batch)._batch_layout()


def test_v2_forward_without_its_step_batch_raises() -> None:
    capture = capture_with(SimpleNamespace())
    capture.prepared = None
    with pytest.raises(CorruptCaptureError, match="prepare_inputs"):
        capture._batch_layout()


# --------------------------------------------------------------------------- runner patches


class RunnerV2:
    """Model Runner V2's shape: no input_batch; execute_model calls prepare_inputs."""

    def __init__(self) -> None:
        self.batch = SimpleNamespace(req_ids=["a"])

    def execute_model(self, scheduler_output: Any, dummy_run: bool = False) -> Any:
        return self.prepare_inputs(scheduler_output)

    def prepare_inputs(self, scheduler_output: Any) -> Any:
        return self.batch


def wrapped_runner(runner: Any) -> LayerCapture:
    capture = LayerCapture.__new__(LayerCapture)
    capture.runner, capture.adapter, capture.handles = runner, ADAPTER, []
    capture._start([], recording=True, stream_to_host=False)
    capture.patcher = Patcher(ADAPTER)
    capture._wrap_runner()
    return capture


def test_runner_patches_are_recorded_and_close_reverts_them() -> None:
    runner = RunnerV2()
    capture = wrapped_runner(runner)
    assert set(vars(runner)) == {"batch", "execute_model", "prepare_inputs"}
    assert patched_by(vars(runner)["execute_model"]) == ADAPTER
    assert patched_by(vars(runner)["prepare_inputs"]) == ADAPTER
    assert capture.patcher.patch_count == 2
    step = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="a",
                                                               prompt_token_ids=[1, 2])])
    assert runner.execute_model(step) is runner.batch
    assert capture.prompt_lengths == {"a": 2}  # the step went through the capture
    capture.close()
    assert set(vars(runner)) == {"batch"}
    assert runner.execute_model.__func__ is RunnerV2.execute_model
    assert runner.prepare_inputs.__func__ is RunnerV2.prepare_inputs
    assert capture.patcher.patch_count == 0


def test_a_runner_is_not_wrapped_twice() -> None:
    runner = RunnerV2()
    first = wrapped_runner(runner)
    with pytest.raises(AdapterError, match="already patched"):
        wrapped_runner(runner)
    first.close()
    wrapped_runner(runner).close()
    assert set(vars(runner)) == {"batch"}


def test_a_v1_runner_gets_only_execute_model() -> None:
    runner = RunnerV2()
    runner.input_batch = SimpleNamespace(req_ids=[])  # type: ignore[attr-defined]
    capture = wrapped_runner(runner)
    assert "prepare_inputs" not in vars(runner) and "execute_model" in vars(runner)
    capture.close()
    assert "execute_model" not in vars(runner)


# --------------------------------------------------------------------------- decoder_stack


class Stack:
    def __init__(self) -> None:
        self.layers = ["layer0", "layer1"]


class CausalLM:
    """LlamaForCausalLM and friends: the stack is ``.model``."""

    def __init__(self) -> None:
        self.model = Stack()


class KimiK25_v015:  # vLLM 0.15.x: get_language_model() is the stack itself
    def __init__(self) -> None:
        self.language_model = Stack()
        self.vision_tower = SimpleNamespace()

    def get_language_model(self) -> Stack:
        return self.language_model


class KimiK25_v016:  # vLLM 0.16.0+: get_language_model() is a causal LM
    def __init__(self) -> None:
        self.language_model = CausalLM()

    def get_language_model(self) -> CausalLM:
        return self.language_model


def test_decoder_stack_of_a_causal_lm() -> None:
    model = CausalLM()
    assert decoder_stack(model) is model.model


def test_decoder_stack_of_kimi_on_vllm_0_15() -> None:
    model = KimiK25_v015()
    assert decoder_stack(model) is model.language_model


def test_decoder_stack_of_kimi_on_vllm_0_16() -> None:
    model = KimiK25_v016()
    assert decoder_stack(model) is model.language_model.model


def test_decoder_stack_of_a_bare_stack() -> None:
    stack = Stack()
    assert decoder_stack(stack) is stack


def test_decoder_stack_not_found() -> None:
    class Vision:
        model = SimpleNamespace(encoder=[])

        def get_language_model(self) -> Any:
            return SimpleNamespace()

    with pytest.raises(LookupError, match="cannot find the decoder layers of Vision"):
        decoder_stack(Vision())
    with pytest.raises(LookupError, match="SimpleNamespace"):
        decoder_stack(SimpleNamespace(model=None))
