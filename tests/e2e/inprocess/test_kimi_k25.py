"""speculators 0.3.0/0.4.0 + speccompat on a tiny Kimi-K2.5-architecture checkpoint (vLLM >= 0.15):
KimiK25ForConditionalGeneration has language_model and no .model, which speculators 0.3.0
cannot find on its own (nor 0.4.0 on vLLM 0.15.x); the text part is compared with HF
DeepseekV3 on the same weights."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cpu_build
from support import (
    adapter_applies,
    requires_generator,
    requires_speculators,
    requires_vllm,
    speculators_generator,
)

pytestmark = [requires_vllm, requires_speculators, requires_generator]


@pytest.fixture(scope="module")
def tiny_kimi(models_dir: Path) -> Path:
    import importlib.util

    import tiny_models

    if importlib.util.find_spec("vllm.model_executor.models.kimi_k25") is None:
        pytest.skip("this vLLM has no KimiK25ForConditionalGeneration (added in 0.15.0)")
    os.environ["VLLM_MLA_DISABLE"] = "1"  # Kimi's text model is MLA; the CPU build has none
    return tiny_models.build_kimi_k25(models_dir / "kimi-k25")


def test_kimi_k25_matches_hf_text_model(tiny_kimi: Path) -> None:
    import torch

    import hf_reference
    import tiny_models

    cpu_build.MOE_WITHOUT_AVX512_NEEDS_CURRENT_CONFIG.skip_if_present(
        "Kimi-K2.5 is checked on the other releases and on CPUs with AVX-512")
    layer_ids = [0, 2, 3]
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE - len(tiny_models.KIMI_MEDIA_TOKENS),
                                       [7, 40, 129])
    with speculators_generator(tiny_kimi, layer_ids=layer_ids) as gen:
        results = gen.generate(prompts)
    reference = hf_reference.layer_outputs(tiny_models.kimi_text_reference(tiny_kimi), prompts)
    for prompt, result, want in zip(prompts, results, reference, strict=True):
        states = result["hidden_states"]
        assert len(states) == len(layer_ids)
        for layer, got in zip(layer_ids, states, strict=True):
            assert got.shape == (len(prompt), 64) and got.dtype == torch.bfloat16
            mean, _ = hf_reference.relative_errors(got, want[layer])
            off = int((hf_reference.token_errors(got, want[layer]) > 0.15).sum())
            # bf16 MoE routing flips move a few tokens (see test_seed_pair.py).
            assert mean < 0.05 and off <= 0.05 * len(prompt), (layer, len(prompt), mean, off)


def test_speculators_alone_cannot_find_the_layers(tiny_kimi: Path) -> None:
    from packaging.version import Version

    import speccompat
    from speccompat.inprocess.adapters.model_forward_drift import ID, ID_V04

    vllm = speccompat.detect().vllm
    assert vllm is not None
    if adapter_applies(ID)[0]:
        worker_adapter = ID
    elif adapter_applies(ID_V04)[0] and vllm.version < Version("0.16.0"):
        worker_adapter = ID_V04
    else:
        pytest.skip(f"speculators 0.4.0 finds Kimi-K2.5's layers on vLLM {vllm.version}: "
                    "get_language_model() is a DeepseekV2ForCausalLM with .model from 0.16.0 "
                    "on (what it captures is test_kimi_k25_matches_hf_text_model's)")
    # 0.3.0: before vLLM 0.18 the supports_eagle3 check refuses it; after, model.model fails.
    # 0.4.0 on vLLM 0.15.x: get_language_model() is the DeepseekV2Model, without .model.
    with pytest.raises(RuntimeError, match=r"does not support hidden state|attribute 'model'"), \
            speculators_generator(tiny_kimi, exclude=(worker_adapter,), layer_ids=[1]):
        pass
