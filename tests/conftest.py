"""Shared fixtures. Unit tests use none of these and need neither torch nor vLLM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))  # cpu_env

import cpu_env
import support

cpu_env.set_defaults()


def _skip_if_contract_only() -> None:
    """Model-building fixtures skip where no model may run (``support.contract_only_reason``):
    only source/signature-level contracts run there."""
    if why := support.contract_only_reason():
        pytest.skip(why)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(models_dir: Path) -> Path:
    """bf16 weights: speculators asks for dtype="auto", and vLLM runs fp32 checkpoints in
    bf16 on CPU anyway, so the checkpoint says what the model dtype is."""
    _skip_if_contract_only()
    import tiny_models

    return tiny_models.build_llama(models_dir / "llama", dtype="bfloat16")


@pytest.fixture(scope="session")
def tiny_deepseek(models_dir: Path) -> Path:
    _skip_if_contract_only()
    import tiny_models

    os.environ["VLLM_MLA_DISABLE"] = "1"  # the CPU build has no MLA kernels
    return tiny_models.build_deepseek_v3(models_dir / "dsv3", dtype="bfloat16")


@pytest.fixture(scope="session")
def tiny_deepseek_llama4_scaling(models_dir: Path) -> Path:
    _skip_if_contract_only()
    import tiny_models

    os.environ["VLLM_MLA_DISABLE"] = "1"
    return tiny_models.build_deepseek_v3(
        models_dir / "dsv3-l4s", dtype="bfloat16",
        llama_4_scaling={"original_max_position_embeddings": 16, "beta": 0.5})


@pytest.fixture(scope="session")
def tiny_kimi_k25(models_dir: Path) -> Path:
    """The tiny Kimi-K2.5 of tests/e2e/inprocess/test_kimi_k25.py (same folder: built once per
    run)."""
    _skip_if_contract_only()
    import importlib.util

    import tiny_models

    if importlib.util.find_spec("vllm.model_executor.models.kimi_k25") is None:
        pytest.skip("this vLLM has no KimiK25ForConditionalGeneration (added in 0.15.0)")
    os.environ["VLLM_MLA_DISABLE"] = "1"  # Kimi's text model is MLA; the CPU build has none
    return tiny_models.build_kimi_k25(models_dir / "kimi-k25")
