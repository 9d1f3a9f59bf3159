"""Kimi-K2.5's loader stacks q_a_proj into fused_qkv_a_proj on vLLM 0.15.x, which the
MLA-disabled attention lacks; from 0.16.0 the DeepSeek loader falls back to unfused loading.
With the adapter the checkpoint's projections load unchanged and the extraction matches HF."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from speccompat.inprocess.adapters.kimi_k25_unfused_qkv_a_proj import (
    ID,
    RAW_MAPPING,
    unfused_target,
)
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    source_text,
    speculators_generator,
    vllm_in,
    worker_call,
)

pytestmark = [requires_vllm, requires_speculators]
LAYER_IDS = [0, 2, 3]
ATTN = "language_model.layers.0.self_attn"
KIMI_K25 = "vllm.model_executor.models.kimi_k25"
CKPT = "language_model.model.layers.0.self_attn"


@vllm_in(">=0.15.0,<0.16.0", "0.16.0 loads Kimi's text model with DeepseekV2ForCausalLM's loader")
def test_raw_kimi_loader_always_stacks_q_a_proj() -> None:
    from vllm.model_executor.models.deepseek_v2 import (
        DeepseekV2Attention,
        DeepseekV2MLAAttention,
    )

    loader = source_text(KIMI_K25, "KimiK25ForConditionalGeneration.load_weights")
    # No fallback when the fused parameter is missing (DeepSeek's loader has one).
    assert RAW_MAPPING in loader and "name_mapped not in params_dict" not in loader
    # Only the MLA attention has the fused parameter; the one VLLM_MLA_DISABLE=1 picks has not.
    assert "self.fused_qkv_a_proj" in inspect.getsource(DeepseekV2MLAAttention.__init__)
    plain = inspect.getsource(DeepseekV2Attention.__init__)
    assert "self.q_a_proj" in plain and "fused_qkv_a_proj" not in plain


@vllm_in(">=0.16.0", "Kimi's own loader (0.15.x) stacks q_a_proj unconditionally")
def test_raw_deepseek_loader_falls_back_to_unfused_from_0_16() -> None:
    import vllm.model_executor.models.deepseek_v2 as deepseek_v2

    loader = source_text(KIMI_K25, "KimiK25ForConditionalGeneration.load_weights")
    assert "AutoWeightsLoader(self)" in loader
    assert "name_mapped not in params_dict" in inspect.getsource(deepseek_v2)


def test_only_unfused_projections_without_a_fused_parameter_are_diverted() -> None:
    unfused = {f"{ATTN}.q_a_proj.weight": 0, f"{ATTN}.kv_a_proj_with_mqa.weight": 0}
    fused = {f"{ATTN}.fused_qkv_a_proj.weight": 0}
    assert unfused_target(f"{CKPT}.q_a_proj.weight", unfused) == f"{ATTN}.q_a_proj.weight"
    assert (unfused_target(f"{CKPT}.kv_a_proj_with_mqa.weight", unfused)
            == f"{ATTN}.kv_a_proj_with_mqa.weight")
    assert unfused_target(f"{CKPT}.q_a_proj.weight", fused) is None  # MLA: Kimi's loader
    assert unfused_target(f"{CKPT}.q_b_proj.weight", unfused) is None
    # A layer this model has no parameters for (an MTP layer Kimi's loader skips).
    assert unfused_target("language_model.model.layers.9.self_attn.q_a_proj.weight",
                          unfused) is None


@needs_adapter(ID)
def test_kimi_loads_the_checkpoint_projections_and_matches_hf(tiny_kimi_k25: Path) -> None:
    import torch
    from safetensors.torch import load_file

    import hf_reference
    import tiny_models

    def attention_weights(worker):  # type: ignore[no-untyped-def]
        model = worker.model_runner.get_model()
        return {name: param.detach().cpu().clone() for name, param in model.named_parameters()
                if "a_proj" in name}

    prompts = tiny_models.make_prompts(
        tiny_models.VOCAB_SIZE - len(tiny_models.KIMI_MEDIA_TOKENS), [7, 40, 129])
    with speculators_generator(tiny_kimi_k25, layer_ids=LAYER_IDS) as gen:
        [loaded] = worker_call(gen, attention_weights)
        results = gen.generate(prompts)
    checkpoint = load_file(tiny_kimi_k25 / "model.safetensors")
    assert not any("fused_qkv_a_proj" in name for name in loaded)
    want = {name.replace("language_model.model", "language_model"): tensor
            for name, tensor in checkpoint.items() if "a_proj" in name}
    assert sorted(loaded) == sorted(want) and len(want) == 2 * 4  # two per layer
    for name, tensor in want.items():
        assert torch.equal(loaded[name], tensor), name  # bit for bit, as on vLLM 0.16.0
    reference = hf_reference.layer_outputs(tiny_models.kimi_text_reference(tiny_kimi_k25), prompts)
    rows = hf_reference.layer_errors(results, reference, LAYER_IDS)
    print("KIMI_VS_HF", ID, rows)
    for layer, tokens, mean, _, off in rows:
        # bf16 MoE routing flips move a few tokens (see tests/e2e/inprocess/test_seed_pair.py).
        assert mean < 0.05 and off <= 0.05 * tokens, (layer, tokens, mean, off)


@needs_adapter(ID)
def test_kimi_fails_to_load_without_it(
    tiny_kimi_k25: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Exception, match="WorkerProc initialization failed"), \
            speculators_generator(tiny_kimi_k25, exclude=(ID,), layer_ids=[1]):
        pass
    # The worker's logged traceback (its output is this process's): Kimi's loader looked
    # up the fused name the MLA-disabled attention does not have.
    captured = capfd.readouterr()
    assert f"KeyError: '{ATTN}.fused_qkv_a_proj.weight'" in captured.out + captured.err
