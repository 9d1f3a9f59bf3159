"""Kimi-K2.5 asks torch.cuda for its device on vLLM 0.15.x (the platform from 0.16.0); with
the adapter the tiny Kimi loads on the CPU build and its extraction matches HF."""

from __future__ import annotations

from pathlib import Path

import pytest

from speccompat.inprocess.adapters.kimi_k25_cuda_current_device import ID, RAW_LINE
from support import (
    needs_adapter,
    only,
    requires_speculators,
    requires_vllm,
    source_text,
    speculators_generator,
    vllm_in,
    worker_call,
)

pytestmark = [requires_vllm, requires_speculators]
KIMI_K25 = "vllm.model_executor.models.kimi_k25"
LAYER_IDS = [0, 2, 3]


@pytest.fixture
def cpu_only() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch.cuda.current_device() answers on CUDA; the failure is the CPU build's")


@vllm_in(">=0.15.0,<0.16.0", "0.16.0 asks current_platform.current_device()")
def test_raw_kimi_init_asks_torch_cuda() -> None:
    assert RAW_LINE in source_text(KIMI_K25, "KimiK25ForConditionalGeneration.__init__")


@vllm_in(">=0.16.0", "KimiK25ForConditionalGeneration is new in 0.15.0 and asks torch.cuda there")
def test_raw_kimi_init_asks_the_platform_from_0_16() -> None:
    source = source_text(KIMI_K25, "KimiK25ForConditionalGeneration.__init__")
    assert "current_platform.current_device()" in source and "torch.cuda" not in source


@pytest.mark.usefixtures("cpu_only")
@vllm_in(">=0.15.0,<0.16.0", "0.16.0 asks current_platform.current_device()")
def test_raw_torch_cuda_current_device_fails_on_the_cpu_build() -> None:
    import torch

    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.current_device()


@needs_adapter(ID)
def test_kimi_module_gets_the_platform_device() -> None:
    import importlib

    import torch
    from vllm.platforms import current_platform

    kimi = importlib.import_module(KIMI_K25)
    with only(ID):
        assert kimi.torch.cuda.current_device() == current_platform.current_device()
        assert kimi.torch.float32 is torch.float32 and kimi.torch.cat is torch.cat
        assert kimi.torch.cuda.is_available is torch.cuda.is_available
    assert kimi.torch is torch  # revert() restores the very module


@needs_adapter(ID)
def test_kimi_loads_and_matches_hf(tiny_kimi_k25: Path) -> None:
    import hf_reference
    import tiny_models

    def devices(worker):  # type: ignore[no-untyped-def]
        from vllm.platforms import current_platform

        model = worker.model_runner.get_model()
        return (str(model.device), str(current_platform.current_device()),
                sorted({str(p.device) for p in model.parameters()}))

    prompts = tiny_models.make_prompts(
        tiny_models.VOCAB_SIZE - len(tiny_models.KIMI_MEDIA_TOKENS), [7, 40, 129])
    with speculators_generator(tiny_kimi_k25, layer_ids=LAYER_IDS) as gen:
        replies = worker_call(gen, devices)
        results = gen.generate(prompts)
    for model_device, platform_device, parameter_devices in replies:
        assert model_device == platform_device  # the vision tower went there too
        assert len(parameter_devices) == 1, parameter_devices
    reference = hf_reference.layer_outputs(tiny_models.kimi_text_reference(tiny_kimi_k25), prompts)
    rows = hf_reference.layer_errors(results, reference, LAYER_IDS)
    print("KIMI_VS_HF", ID, rows)
    for layer, tokens, mean, _, off in rows:
        # bf16 MoE routing flips move a few tokens (see tests/e2e/inprocess/test_seed_pair.py).
        assert mean < 0.05 and off <= 0.05 * tokens, (layer, tokens, mean, off)


@pytest.mark.usefixtures("cpu_only")
@needs_adapter(ID)
def test_kimi_fails_to_load_without_it(
    tiny_kimi_k25: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Exception, match="WorkerProc initialization failed"), \
            speculators_generator(tiny_kimi_k25, exclude=(ID,), layer_ids=[1]):
        pass
    # The worker's logged traceback (its output is this process's) names the line.
    captured = capfd.readouterr()
    assert RAW_LINE in captured.out + captured.err
