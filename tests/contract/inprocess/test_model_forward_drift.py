"""speculators 0.3.0's copied model forward vs vLLM's own, and the hook-based capture."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cpu_build
import speccompat
from speccompat.inprocess.adapters.model_forward_drift import ID
from support import (
    in_fresh_process,
    needs_adapter,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]
WORKER_EXTENSION = "speculators.data_generation.custom_worker.HiddenStatesWorkerExtension"
IN_0_4 = "speculators 0.4.0's capture is test_model_forward_drift_v04.py's"


@vllm_in(">=0.11.1", "the inner models still have get_input_embeddings before 0.11.1")
def test_raw_inner_models_renamed_get_input_embeddings() -> None:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model
    from vllm.model_executor.models.llama import LlamaModel

    for model in (LlamaModel, DeepseekV2Model):
        assert hasattr(model, "embed_input_ids")
        assert not hasattr(model, "get_input_embeddings")


@vllm_in(">=0.12.0", "DeepSeek layers take no llama_4_scaling before 0.12.0")
def test_raw_deepseek_forward_passes_llama_4_scaling_to_each_layer() -> None:
    import importlib

    from vllm.model_executor.models.deepseek_v2 import DeepseekV2DecoderLayer, DeepseekV2Model

    from support import import_fixes, only

    fixes = import_fixes()  # speculators must import here (transformers 5)
    with only(*fixes) if fixes else contextlib.nullcontext():
        custom_worker = importlib.import_module("speculators.data_generation.custom_worker")

    assert "llama_4_scaling" in inspect.signature(DeepseekV2DecoderLayer.forward).parameters
    assert "llama_4_scaling" in inspect.getsource(DeepseekV2Model.forward)
    assert "llama_4_scaling" not in inspect.getsource(custom_worker._patched_forward)


def test_raw_deepseek_eagle3_support_follows_the_release() -> None:
    from packaging.version import Version
    from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM
    from vllm.model_executor.models.interfaces import supports_eagle3

    # speculators 0.3.0 refuses models that are not supports_eagle3: DeepSeek until 0.18.0.
    env = speccompat.detect()
    assert env.vllm is not None
    assert supports_eagle3(DeepseekV3ForCausalLM) is (env.vllm.version >= Version("0.18.0"))


@vllm_in(">=0.15.0", "KimiK25ForConditionalGeneration was added in 0.15.0")
def test_raw_kimi_k25_has_no_model_attribute() -> None:
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration

    source = inspect.getsource(KimiK25ForConditionalGeneration.__init__)
    assert "self.language_model" in source and "self.model =" not in source
    assert hasattr(KimiK25ForConditionalGeneration, "get_language_model")


@needs_adapter(ID, IN_0_4)
@vllm_in(">=0.11.1", "on vLLM 0.11.0, its own pin, speculators 0.3.0's copied forward "
         "still runs Llama")
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    import tiny_models

    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [9])
    # The copied forward already runs in the warm-up inside the generator's constructor.
    with pytest.raises(RuntimeError, match="get_input_embeddings"), speculators_generator(
        tiny_llama, exclude=(ID,), layer_ids=[1]
    ) as gen:
        gen.generate(prompts)


@pytest.fixture(scope="module")
def engine(tiny_deepseek_llama4_scaling: Path) -> Iterator[Any]:
    """An in-process engine (engine core and worker in this process) on a DeepSeek V3
    config that sets llama_4_scaling, with speculators' worker extension."""
    from vllm import LLM

    import speccompat
    from support import import_fixes

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    fixes = import_fixes()  # the worker extension is imported in this process
    if fixes:
        speccompat.apply(only=fixes)
    args = dict(model=str(tiny_deepseek_llama4_scaling), max_model_len=256,
                enforce_eager=True, enable_prefix_caching=False,
                worker_extension_cls=WORKER_EXTENSION)
    cpu_build.MOE_WITHOUT_AVX512_NEEDS_CURRENT_CONFIG.skip_if_present(
        "the drift is checked on the other releases and on CPUs with AVX-512")
    if cpu_build.AMX_ATTENTION_HEAD_DIM_32.present():
        # The test compares the capture with vLLM's own forward, which float32 shows as
        # well; float32 is not the default, since on 0.20-0.22 it takes a MoE op that needs
        # a current config in the worker.
        cpu_build.MOE_FP32_NEEDS_CURRENT_CONFIG.skip_if_present(
            "and bf16 meets the AMX attention bug on this machine; the drift is checked on "
            "the other releases")
        args["dtype"] = "float32"
    try:
        current = cpu_build.MOE_OP_NEEDS_CURRENT_CONFIG.present()
        with _engine_config_current(args) if current else contextlib.nullcontext():
            llm = LLM(**args)
    finally:
        if fixes:
            speccompat.revert()
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old
    yield llm
    del llm


@contextlib.contextmanager
def _engine_config_current(args: dict[str, Any]) -> Iterator[None]:
    """The engine's config as vLLM's current one while this process runs its forward
    (warm-up included), for the CPU build bug ``cpu_build.MOE_OP_NEEDS_CURRENT_CONFIG``."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    with set_current_vllm_config(EngineArgs(**args).create_engine_config()):
        yield


def _spy_layers(llm: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Record, per decoder-layer call, llama_4_scaling as received and the layer output."""
    executor = llm.llm_engine.model_executor
    if not hasattr(executor, "driver_worker"):
        # vLLM 0.22's CPU platform always runs the worker in its own process; the GPU
        # test tests/gpu (test_llama_4_scaling_is_vllms_own) checks this on CUDA there.
        pytest.skip("this vLLM CPU build runs no worker in-process to spy on")
    model = executor.driver_worker.worker.model_runner.get_model()
    scales: list[Any] = []
    outputs: list[Any] = []

    def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        scale = args[3] if len(args) > 3 else kwargs.get("llama_4_scaling")
        scales.append(None if scale is None else scale.detach().clone())

    def after(module: Any, args: Any, output: Any) -> None:
        hidden, residual = output
        outputs.append((hidden + residual).detach().clone())

    handles = []
    for layer in model.model.layers:
        handles.append(layer.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(layer.register_forward_hook(after))
    return scales, outputs, handles


def _generate(llm: Any, prompt: list[int]) -> None:
    from vllm import SamplingParams
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(llm.llm_engine.vllm_config):
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1), use_tqdm=False)


@needs_adapter(ID, IN_0_4)
@vllm_in(">=0.12.0", "DeepSeek layers take llama_4_scaling from vLLM 0.12.0")
def test_capture_keeps_vllms_llama_4_scaling(request: pytest.FixtureRequest) -> None:
    """In a process of its own: vLLM 0.32's CPU worker cannot start in-process once the
    process imported numba (its kernel-override scan trips over llvmlite's library
    proxy), and the tests before this one import it."""
    if not in_fresh_process(request):
        return
    engine = request.getfixturevalue("engine")
    import torch
    from vllm.model_executor.models.deepseek_v2 import _get_llama_4_scaling

    import tiny_models

    prompt = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [40])[0]  # past 16: scale > 1
    scales, outputs, handles = _spy_layers(engine)
    try:
        _generate(engine, prompt)  # vLLM's own forward, nothing patched
        reference_scales, reference_outputs = list(scales), list(outputs)
        scales.clear()
        outputs.clear()
        report = speccompat.apply(only=[ID])
        assert report.state_of(ID) is speccompat.State.APPLIED
        engine.collective_rpc("_setup_hidden_states_capture", args=([1, 3],))
        engine.collective_rpc("_reset_capture")
        _generate(engine, prompt)
        captured = engine.collective_rpc("_get_captured_states")[0]
    finally:
        speccompat.revert()
        for handle in handles:
            handle.remove()
    positions = torch.arange(len(prompt))
    expected = _get_llama_4_scaling(original_max_position_embeddings=16, scaling_beta=0.5,
                                    positions=positions)
    assert len(scales) == len(reference_scales) == 4
    for got, want in zip(scales, reference_scales, strict=True):
        assert want is not None and got is not None
        assert torch.equal(got, want)
        assert torch.allclose(want[: len(prompt)].float(), expected.float())
    assert [c.shape for c in captured] == [(len(prompt), 64)] * 2
    assert torch.equal(captured[0], reference_outputs[1][: len(prompt)])
    assert torch.equal(captured[1], reference_outputs[3][: len(prompt)])
