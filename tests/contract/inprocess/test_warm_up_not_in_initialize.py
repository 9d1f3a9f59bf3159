"""Executor.initialize_from_config stops warming up (vLLM 0.27.0); the generator's view does."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

import speccompat
from speccompat.inprocess.adapters.warm_up_not_in_initialize import ID
from support import needs_adapter, requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


def test_raw_initialize_warms_up_only_before_0_27() -> None:
    from vllm.v1.executor.abstract import Executor

    env = speccompat.detect()
    assert env.vllm is not None
    warms_up = "compile_or_warm_up_model" in inspect.getsource(Executor.initialize_from_config)
    assert warms_up is (env.vllm.version < Version("0.27.0"))
    if not warms_up:
        assert callable(Executor.compile_or_warm_up_model)


def count_warm_ups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A spy on the real MultiprocExecutor.compile_or_warm_up_model (calls through)."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    calls: list[int] = []
    original = MultiprocExecutor.compile_or_warm_up_model

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MultiprocExecutor, "compile_or_warm_up_model", spy)
    return calls


@needs_adapter(ID)
def test_generator_warms_up_once(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiny_models

    calls = count_warm_ups(monkeypatch)
    with speculators_generator(tiny_llama, layer_ids=[1]) as gen:
        assert calls == [1]
        out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [9]))
        assert out[0]["hidden_states"][0].shape[0] == 9


@needs_adapter(ID)
def test_generator_fails_without_it(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_warm_ups(monkeypatch)
    with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]):
        assert calls == []  # the workers never warmed up
