"""A worker that raises mid-extraction surfaces as one clear error in the caller; no
partial batch is returned, and the generator refuses further work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from support import requires_speculators, requires_vllm, speculators_generator

pytestmark = [requires_vllm, requires_speculators]


@pytest.fixture
def failing_extension() -> Iterator[None]:
    """The generator hard-codes speculators' extension; swap in the failing subclass."""
    from speculators.data_generation import vllm_hidden_states_generator as module

    original = module.ParallelConfig

    def parallel_config(*args: Any, **kwargs: Any) -> Any:
        kwargs["worker_extension_cls"] = "failing_worker.FailingExtension"
        return original(*args, **kwargs)

    module.ParallelConfig = parallel_config
    try:
        yield
    finally:
        module.ParallelConfig = original


@pytest.mark.usefixtures("failing_extension")
def test_worker_failure_is_one_clear_error(tiny_llama: Path) -> None:
    import tiny_models

    # Two 3000-token prompts and one of 3000: the batch needs two steps (8192-token budget).
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [3000, 3000, 3000])
    with speculators_generator(tiny_llama, layer_ids=[1, 2], max_model_len=4096) as gen:
        returned = None
        with pytest.raises(speccompat.WorkerFailedError) as failure:
            returned = gen.generate(prompts)
        assert returned is None
        message = str(failure.value)
        assert "injected failure in decoder layer 1" in message
        assert "build a new one" in message
        with pytest.raises(speccompat.WorkerFailedError, match="failed earlier"):
            gen.generate(prompts[:1])


def test_speccompat_never_allows_insecure_serialization(tiny_llama: Path) -> None:
    import os

    speccompat.apply()
    try:
        assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ
    finally:
        speccompat.revert()
