"""speculators 0.4.0's copied model forward vs vLLM's own, and the hook-based capture.

The DeepSeek V3 checkpoint sets ``llama_4_scaling`` (original_max_position_embeddings 16,
beta 0.5): from vLLM 0.12.0 ``DeepseekV2Model.forward`` scales the queries of every token
at position 16 or later, which HF transformers ignores; so the reference is vLLM's own
forward, read by spy hooks on the decoder layers inside the generator's worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cpu_build
import speccompat
from speccompat.inprocess.adapters.model_forward_drift import ID_V04
from speccompat.targets import WORKER_EXTENSION, module_source
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    speculators_in,
    vllm_in,
)

pytestmark = [
    requires_vllm, requires_speculators,
    speculators_in("==0.4.*", "this file pins speculators 0.4.0's worker extension; "
                   "0.3.0's is test_model_forward_drift.py's"),
]
LAYER_IDS = [1, 3]
PROMPT_LENGTH = 40  # past original_max_position_embeddings: scales 1.35 and 1.55
UNSCALED = 16  # positions below original_max_position_embeddings: scale 1
SCALING_FROM = ">=0.12.0"
NO_SCALING = "vLLM applies llama_4_scaling from 0.12.0 on"


def _copied_forward() -> str:
    source = module_source(WORKER_EXTENSION)
    assert source is not None
    start = source.index("def _patched_forward(")
    return source[start:source.index("\nclass ", start)]


@vllm_in(SCALING_FROM, NO_SCALING)
def test_raw_copied_forward_calls_layers_without_llama_4_scaling() -> None:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer, DeepseekV2Model

    assert "llama_4_scaling" in inspect.signature(DeepseekV2DecoderLayer.forward).parameters
    assert "llama_4_scaling" in inspect.getsource(DeepseekV2Model.forward)
    copied = _copied_forward()
    assert "hidden_states=hidden_states, positions=positions, residual=residual" in copied
    assert "llama_4_scaling" not in copied


def test_raw_copied_capture_orders_rows_by_the_v1_input_batch() -> None:
    source = module_source(WORKER_EXTENSION)
    assert source is not None
    assert "input_batch = self.model_runner.input_batch" in source
    assert "input_batch.req_id_to_index" in source
    # Model Runner V2 (vLLM 0.12.0 opt-in, the default on CUDA from 0.22.0/0.29.0) has none.
    runner_v2 = module_source("vllm.v1.worker.gpu.model_runner")
    if runner_v2 is not None:
        assert "self.input_batch" not in runner_v2


@vllm_in("<0.11.1", "the inner models have embed_input_ids from 0.11.1 on")
def test_raw_copied_forward_calls_embed_input_ids() -> None:
    from vllm.model_executor.models.llama import LlamaModel

    assert "self.embed_input_ids(input_ids)" in _copied_forward()
    assert not hasattr(LlamaModel, "embed_input_ids")
    assert hasattr(LlamaModel, "get_input_embeddings")


def _layer_spy() -> tuple[Callable[[Any], int], Callable[[Any], dict[str, list[Any]]]]:
    """Two functions for ``collective_rpc``: hooks on every decoder layer that record the
    ``llama_4_scaling`` each call receives and the layer's output, and their collection.
    Defined here so that cloudpickle sends them by value to the worker processes."""

    def install(wrapper: Any) -> int:
        from speccompat.inprocess.capture import decoder_stack

        worker = getattr(wrapper, "worker", wrapper)
        stack = decoder_stack(worker.model_runner.get_model())
        record: dict[str, list[Any]] = {"scales": [], "outputs": []}

        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            scale = args[3] if len(args) > 3 else kwargs.get("llama_4_scaling")
            record["scales"].append(None if scale is None else scale.detach().clone())

        def after(module: Any, args: Any, output: Any) -> None:
            hidden, residual = output
            record["outputs"].append((hidden + residual).detach().clone())

        handles = []
        for layer in stack.layers:
            handles.append(layer.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(layer.register_forward_hook(after))
        worker._speccompat_test_spy = (record, handles)
        return len(stack.layers)

    def collect(wrapper: Any) -> dict[str, list[Any]]:
        worker = getattr(wrapper, "worker", wrapper)
        record, handles = worker._speccompat_test_spy
        for handle in handles:
            handle.remove()
        return record  # type: ignore[no-any-return]

    return install, collect


def _spied_run(model: Path, prompt: list[int], **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """One batch through speculators' generator, and what vLLM's layers saw and gave."""
    install, collect = _layer_spy()
    with speculators_generator(model, layer_ids=LAYER_IDS, **kwargs) as gen:
        assert speccompat.collective_rpc(gen.executor, install, rank=0) == 4
        results = gen.generate([prompt])
        record = speccompat.collective_rpc(gen.executor, collect, rank=0)
    assert len(record["outputs"]) == 4  # one forward (one prefill step), four layers
    return results, record


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [PROMPT_LENGTH])[0]


@pytest.fixture(scope="module")
def vllms_own(tiny_deepseek_llama4_scaling: Path, prompt: list[int]) -> tuple[Any, Any]:
    """With speccompat: the generator's samples and vLLM's own layer outputs, one run."""
    cpu_build.MOE_OP_NEEDS_CURRENT_CONFIG.skip_if_present(
        "the other releases from 0.12.0 check the drift")
    return _spied_run(tiny_deepseek_llama4_scaling, prompt)


@needs_adapter(ID_V04, "speculators 0.3.0's capture is test_model_forward_drift.py's")
@vllm_in(SCALING_FROM, NO_SCALING)
def test_capture_is_vllms_own_forward_with_llama_4_scaling(
    vllms_own: tuple[Any, Any], prompt: list[int]
) -> None:
    import torch
    from vllm.model_executor.models.deepseek_v2 import _get_llama_4_scaling

    results, record = vllms_own
    expected = _get_llama_4_scaling(original_max_position_embeddings=16, scaling_beta=0.5,
                                    positions=torch.arange(PROMPT_LENGTH))
    for scale in record["scales"]:
        assert scale is not None
        assert torch.allclose(scale[:PROMPT_LENGTH].float(), expected.float())
    assert len(results) == 1 and torch.equal(results[0]["input_ids"], torch.tensor(prompt))
    states = results[0]["hidden_states"]
    assert [s.shape for s in states] == [(PROMPT_LENGTH, 64)] * len(LAYER_IDS)
    for got, layer in zip(states, LAYER_IDS, strict=True):
        assert torch.equal(got, record["outputs"][layer][:PROMPT_LENGTH]), layer


@needs_adapter(ID_V04, "speculators 0.3.0's capture is test_model_forward_drift.py's")
@vllm_in(SCALING_FROM, "before vLLM 0.12.0 the copied forward fails on embed_input_ids "
         "(test_generator_fails_without_it_on_vllm_0_11_0), and from 0.11.1 to 0.11.2 it "
         "matches vLLM's forward")
def test_generator_fails_without_it(
    tiny_deepseek_llama4_scaling: Path, vllms_own: tuple[Any, Any], prompt: list[int]
) -> None:
    import torch

    import hf_reference

    expected, _ = vllms_own
    native, record = _spied_run(tiny_deepseek_llama4_scaling, prompt, exclude=(ID_V04,))
    # The copied forward calls every layer without llama_4_scaling ...
    assert record["scales"] == [None] * 4
    # ... so the samples silently differ from vLLM's forward where the scale is not 1.
    for got, want in zip(native[0]["hidden_states"], expected[0]["hidden_states"], strict=True):
        assert got.shape == want.shape == (PROMPT_LENGTH, 64)
        assert torch.equal(got[:UNSCALED], want[:UNSCALED])
        off = hf_reference.token_errors(got[UNSCALED:], want[UNSCALED:])
        assert bool((off > 0.01).all()), off


@needs_adapter(ID_V04, "speculators 0.3.0's capture is test_model_forward_drift.py's")
@vllm_in("<0.11.1", "the inner models have embed_input_ids from 0.11.1 on")
def test_generator_fails_without_it_on_vllm_0_11_0(tiny_llama: Path) -> None:
    import tiny_models

    # The copied forward runs in the warm-up inside the generator's constructor.
    with pytest.raises(Exception, match="embed_input_ids"), speculators_generator(
        tiny_llama, exclude=(ID_V04,), layer_ids=[1]
    ) as gen:
        gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [9]))
