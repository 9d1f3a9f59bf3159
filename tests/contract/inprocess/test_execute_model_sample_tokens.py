from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speccompat.inprocess.adapters.execute_model_sample_tokens import ID, ID_V04
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


# --------------------------------------------------------------------------- speculators 0.3.0


@needs_adapter(ID, "speculators 0.4.0 calls sample_tokens after each execute_model itself")
def test_raw_executor_needs_sample_tokens_after_execute_model(tiny_llama: Path) -> None:
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    import tiny_models

    assert hasattr(MultiprocExecutor, "sample_tokens")
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [20])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]) as gen:
        gen.generate(prompts)  # execute_model returns None; nothing samples
        with pytest.raises(RuntimeError, match="sample_tokens"):
            gen.generate(prompts)


@needs_adapter(ID, "speculators 0.4.0 calls sample_tokens after each execute_model itself")
def test_generator_steps_are_completed(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [20, 7])
    with speculators_generator(tiny_llama, layer_ids=[1]) as gen:
        seen: list[object] = []
        sample = gen.executor.unwrapped.sample_tokens

        def spy(grammar_output: object, *args: object, **kwargs: object) -> object:
            seen.append(grammar_output)
            return sample(grammar_output, *args, **kwargs)

        gen.executor.unwrapped.sample_tokens = spy
        for _ in range(3):
            results = gen.generate(prompts)
            assert [r["hidden_states"][0].shape[0] for r in results] == [20, 7]
    assert seen == [None, None, None]  # one sample_tokens per step, without a grammar


# --------------------------------------------------------------------------- speculators 0.4.0


@vllm_in("<0.11.1", "MultiprocExecutor has sample_tokens from 0.11.1 on")
def test_raw_executor_samples_in_execute_model() -> None:
    import inspect

    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    assert not hasattr(MultiprocExecutor, "sample_tokens")
    # One call runs the forward and the sampler: the output is the ModelRunnerOutput.
    assert "ModelRunnerOutput" in str(inspect.signature(MultiprocExecutor.execute_model))


@needs_adapter(ID_V04, "this vLLM has the sample_tokens speculators 0.4.0 calls")
def test_v04_generator_steps_keep_their_sampled_output(tiny_llama: Path) -> None:
    from vllm.v1.outputs import ModelRunnerOutput

    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [20, 7])
    with speculators_generator(tiny_llama, layer_ids=[1]) as gen:
        executor = gen.executor.unwrapped
        outputs: list[Any] = []
        execute = executor.execute_model

        def spy(*args: Any, **kwargs: Any) -> Any:
            outputs.append(execute(*args, **kwargs))
            return outputs[-1]

        executor.execute_model = spy
        for _ in range(3):
            results = gen.generate(prompts)
            assert [r["hidden_states"][0].shape[0] for r in results] == [20, 7]
        assert gen.executor.sample_tokens(outputs[-1]) is outputs[-1]
    assert len(outputs) == 3  # one step per batch: both prompts fit
    for output in outputs:
        assert isinstance(output, ModelRunnerOutput)
        assert sorted(output.req_ids) == sorted(output.req_id_to_index)
        assert all(len(tokens) == 1 for tokens in output.sampled_token_ids)  # sampled


@needs_adapter(ID_V04, "this vLLM has the sample_tokens speculators 0.4.0 calls")
def test_v04_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [20])
    with speculators_generator(tiny_llama, exclude=(ID_V04,), layer_ids=[1]) as gen, \
            pytest.raises(AttributeError, match="sample_tokens"):
        gen.generate(prompts)
