from __future__ import annotations

from pathlib import Path

import pytest

from speccompat.adapters.execute_model_sample_tokens import ID
from support import requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


def test_raw_executor_needs_sample_tokens_after_execute_model(tiny_llama: Path) -> None:
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    import tiny_models

    assert hasattr(MultiprocExecutor, "sample_tokens")
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [20])
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]) as gen:
        gen.generate(prompts)  # execute_model returns None; nothing samples
        with pytest.raises(RuntimeError, match="sample_tokens"):
            gen.generate(prompts)


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
