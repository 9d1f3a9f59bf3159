"""GPU tests: the e2e checks on CUDA. Fixtures build models with real MLA dimensions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def build_deepseek_mla(path: Path, llama_4_scaling: dict[str, Any] | None = None) -> Path:
    """A tiny DeepSeek V3 whose MLA shapes are the real model's (kv_lora_rank 512, rope 64,
    nope 128, v 128): the CUDA MLA kernels are built for those; width and depth stay tiny."""
    from transformers import DeepseekV3Config

    import tiny_models

    params = {"arch": "deepseek_v3_mla", "builder_version": tiny_models.BUILDER_VERSION,
              "seed": 0, "dtype": "bfloat16", "llama_4_scaling": llama_4_scaling}

    def make_config() -> Any:
        extra = {"llama_4_scaling": dict(llama_4_scaling)} if llama_4_scaling else {}
        return DeepseekV3Config(
            vocab_size=tiny_models.VOCAB_SIZE, hidden_size=256, intermediate_size=512,
            moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=8, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
            n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
            routed_scaling_factor=2.5, q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=4096, rope_scaling=None,
            initializer_range=0.05, tie_word_embeddings=False, bos_token_id=tiny_models.BOS_ID,
            eos_token_id=tiny_models.EOS_ID, pad_token_id=tiny_models.PAD_ID,
            topk_method="noaux_tc", scoring_func="sigmoid", num_nextn_predict_layers=0,
            dtype="bfloat16", **extra)

    return tiny_models._build_cached(path, params, make_config)


@pytest.fixture(scope="session")
def deepseek_mla(models_dir: Path) -> Path:
    return build_deepseek_mla(models_dir / "dsv3-mla")


@pytest.fixture(scope="session")
def deepseek_mla_llama4_scaling(models_dir: Path) -> Path:
    return build_deepseek_mla(models_dir / "dsv3-mla-l4s",
                              {"original_max_position_embeddings": 16, "beta": 0.5})


@pytest.fixture(scope="session")
def tiny_qwen3(models_dir: Path) -> Path:
    import tiny_models

    return tiny_models.build_qwen3(models_dir / "qwen3")
