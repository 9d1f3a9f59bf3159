# ruff: noqa
# vLLM's own tests/v1/kv_connector/extract_hidden_states_integration/test_extraction.py at
# v0.32.0, carried by speccompat to vLLM 0.34.0 (issue #35's tests/upstream): it runs on a
# CUDA host (vLLM 0.34.0 has no CPU build and no V1 model runner: V2 only, CUDA) with vLLM
# 0.34.0's CUDA wheel, speculators 0.9.0 and speccompat, offline (no model hub).
#
# HOW TO RUN (this folder is not in nox's upstream-tests: that session installs a release's
# CPU build, which 0.34.0 lacks; CI collects tests/unit and the folders its sessions name,
# never tests/upstream). On the CUDA host, from the repository root, with vLLM 0.34.0,
# speculators 0.9.0, pytest and speccompat installed into /tmp/site:
#
#   PYTHONPATH=/tmp/site:$PWD/tests:$PWD/tests/upstream:$PWD/tests/upstream/vllm_v0.34.0 \
#     python3 -m pytest -p no:cacheprovider -v tests/upstream/vllm_v0.34.0
#
# (tests/: tiny_models, the offline stand-ins; tests/upstream: upstream_support and its
# conftest; this folder: predictable_llama and attention_utils, imported by file name.
# SPECCOMPAT_DISABLE=1 runs them with speccompat off.) One GPU is enough: the
# tensor-parallel test skips below two. Every engine here asks for a small share of the GPU
# (gpu_memory_utilization=0.1, about 14 GiB of an H200's free memory at start-up, and a
# fixed 1 GiB KV cache, kv_cache_memory_bytes=1<<30), so that it starts beside another
# process on the same GPU.
#
# Provenance: this file is NOT a copy of vLLM's 0.34.0 test: no source of vLLM 0.34.0's
# tests could be taken here (PyPI has no vllm or vllm_tpu 0.34.0 source distribution;
# vllm_tpu stops at 0.32.0). The base is this repository's 0.32.0 copy
# (tests/upstream/vllm_v0.32.0/, from vllm_tpu-0.32.0.tar.gz; its source is
# https://github.com/vllm-project/vllm/blob/5df63a720/tests/v1/kv_connector/extract_hidden_states_integration/test_extraction.py),
# checked against the vLLM modules of the CUDA wheel
# vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl (vllm/_version.py: 0.34.0, commit
# g62d4bc3c7): LLM(...) takes the same arguments (model_class_overrides,
# speculative_config, kv_transfer_config, kv_cache_memory_bytes), and
# example_hidden_states_connector still has load_hidden_states and cleanup_hidden_states.
# What upstream's own 0.34.0 test holds is not known here. The predictable model's
# assertions are per prompt, none on request order against slot order.
# License: Apache-2.0, as the SPDX lines below say (vLLM's).
# Every assertion kept.
# Adapted (each place is marked '# speccompat:'):
#   - tests.utils (vLLM's test helpers, not importable here):
#     create_new_process_for_each_test comes from upstream_support (each test it marks
#     runs in a fresh interpreter, as vLLM's spawn variant does); multi_gpu_test is
#     upstream_support.multi_cuda_gpu_test: it skips below num_gpus CUDA devices.
#   - every engine test skips where vLLM's platform is not CUDA (vLLM 0.34.0 runs on CUDA
#     only; its CUDA wheel on a machine without a GPU collects them, no more).
#   - gpu_memory_utilization=0.1 and kv_cache_memory_bytes=1<<30 in every LLM(...)
#     (upstream: the default 0.9, or 0.4), so that the test starts beside another process.
#   - predictable_llama_config_path: the tokenizer comes from
#     tests/tiny_models.build_tokenizer instead of the model hub
#     (TinyLlama/TinyLlama-1.1B-Chat-v1.0); the test model's configuration is upstream's.
#   - test_extract_hidden_states_qwen35_hybrid_smoke: the hub id Qwen/Qwen3.5-0.8B (read
#     only for its configuration and processor: load_format="dummy") is a local
#     Qwen3_5ForConditionalGeneration configuration with the hidden size 1024 the test
#     asserts and 24 layers (3 gated-delta-net to 1 full attention), a 1-layer vision
#     tower, the local tokenizer with Qwen's 4 vision tokens and the image/video processor
#     configurations (upstream_support.qwen35_0_8b_stand_in). The 0.32.0 copy's CPU skip is
#     gone: this is for CUDA.
#   - test_extract_hidden_states_tp2: the hub id Qwen/Qwen3-0.6B (configuration only,
#     load_format="dummy") is a local configuration with hidden size 1024 and 28 layers
#     (upstream_support.qwen3_0_6b_stand_in).
#   - PREDICTABLE_LLAMA_MODEL_CLS: 'predictable_llama:PredictableLlamaForCausalLM' (by file
#     name) instead of the dotted path in vLLM's test tree, with this folder put on
#     PYTHONPATH for the processes vLLM starts.
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

import os
import tempfile

import pytest
import torch

# speccompat: the stand-ins of tests/upstream/upstream_support.py; multi_gpu_test counts
# CUDA devices (upstream_support.multi_cuda_gpu_test).
from upstream_support import (
    create_new_process_for_each_test,
    multi_cuda_gpu_test as multi_gpu_test,
    qwen35_0_8b_stand_in,
    qwen3_0_6b_stand_in,
    save_tokenizer,
)
from vllm import LLM, SamplingParams
from vllm.distributed.kv_transfer.kv_connector.v1 import (
    example_hidden_states_connector,
)
from vllm.platforms import current_platform

# speccompat: vLLM 0.34.0 runs engines on CUDA only (no CPU build, no V1 model runner).
needs_cuda = pytest.mark.skipif(
    not current_platform.is_cuda(),
    reason="vLLM 0.34.0 runs these engines on CUDA only (no CPU build): run this folder "
    "on a CUDA host (see this file's header)",
)
# speccompat: a small share of the GPU and a fixed 1 GiB KV cache for every engine, so
# that it starts beside another process on the same GPU (upstream: 0.9 or 0.4).
SMALL_GPU_SHARE = {"gpu_memory_utilization": 0.1, "kv_cache_memory_bytes": 1 << 30}


def get_and_check_output(output, expected_shape):
    assert output.kv_transfer_params is not None
    hidden_states_path = output.kv_transfer_params.get("hidden_states_path")
    assert hidden_states_path is not None

    obj = example_hidden_states_connector.load_hidden_states(hidden_states_path)
    token_ids = obj["token_ids"]
    hidden_states = obj["hidden_states"]

    prompt_token_ids = output.prompt_token_ids
    assert torch.equal(token_ids, torch.tensor(prompt_token_ids))

    assert hidden_states.shape == expected_shape

    # Verify hidden_states are not all zeros (i.e., they were actually computed)
    assert not torch.allclose(hidden_states, torch.zeros_like(hidden_states))

    return token_ids, hidden_states


@pytest.fixture
def predictable_llama_config_path(tmp_path_factory):
    """Create a minimal LlamaConfig for PredictableLlamaForCausalLM."""
    from transformers import LlamaConfig

    config_dir = tmp_path_factory.mktemp("predictable_llama")

    # Create a minimal Llama config with small dimensions
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=24,  # Enough layers to test various layer_ids
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        architectures=["PredictableLlamaForCausalLM"],
    )

    # Save config
    config.save_pretrained(config_dir)

    # Create a simple tokenizer
    # speccompat: a local word-level tokenizer (tests/tiny_models.py) for the hub's
    # TinyLlama tokenizer; this machine has no model hub.
    save_tokenizer(config_dir)

    return str(config_dir)


# Need for Python 3.14 compatibility, vLLM with force spawn due to CUDA
# reinitialization, and register will not persist.
# speccompat: the module by its file name (this copy's folder, vllm_v0.34.0, is no package),
# and the folder on PYTHONPATH for the processes vLLM starts (its model-inspection subprocess
# imports the class by name).
PREDICTABLE_LLAMA_MODEL_CLS = "predictable_llama:PredictableLlamaForCausalLM"
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")])
)


@needs_cuda  # speccompat: CUDA only
@create_new_process_for_each_test()
def test_extract_hidden_states_with_predictable_dummy_model(
    predictable_llama_config_path, tmp_path, monkeypatch
):
    """Test hidden-state extraction with a predictable dummy model.

    Tests 3 scenarios:

    1. **Basic extraction**: unsorted layer selection, multiple prompts
       of varying length — verifies correct layer association and
       deterministic values.
    2. **Chunked prefill**: max_num_batched_tokens=128 with ~500-token
       prompts so each is split across multiple scheduler iterations —
       verifies hidden states are reassembled correctly.
    3. **Per-request options**: custom hidden_states_path and
       include_output_tokens — verifies per-request kv_transfer_params
       plumbing.
    """
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")

    layer_ids = [5, 2, 10]
    expected_layer_ids = sorted(layer_ids)
    num_layers = len(layer_ids)
    max_num_batched_tokens = 128

    llm = LLM(
        model=predictable_llama_config_path,
        model_class_overrides={
            "PredictableLlamaForCausalLM": PREDICTABLE_LLAMA_MODEL_CLS,
        },
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}
            },
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {
                "shared_storage_path": tmp_path,
                "allow_custom_save_path": True,
            },
        },
        max_model_len=1024,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=True,
        trust_remote_code=True,
        load_format="dummy",
        **SMALL_GPU_SHARE,  # speccompat: upstream takes the default 0.9
    )

    hidden_size = llm.llm_engine.model_config.get_hidden_size()

    # --- Scenario 1: basic extraction with non-sequential layers ----------
    prompts = [
        "Short",
        "Medium length",
        "Much longer prompt with many tokens",
        "Much longer prompt with many tokens",  # repeated prompt
    ]
    sampling_params = SamplingParams(max_tokens=1, temperature=0.0)
    outputs = llm.generate(prompts, sampling_params)

    assert len(outputs) == len(prompts)
    for output in outputs:
        expected_shape = (
            len(output.prompt_token_ids),
            num_layers,
            hidden_size,
        )
        _token_ids, hidden_states = get_and_check_output(output, expected_shape)

        for idx, layer_id in enumerate(expected_layer_ids):
            layer_hidden = hidden_states[:, idx, :]
            assert torch.allclose(
                layer_hidden,
                torch.full_like(layer_hidden, layer_id),
                atol=1e-5,
            ), (
                f"Layer {layer_id} at position {idx} should output "
                f"{float(layer_id)}, but got mean="
                f"{layer_hidden.mean():.3f}, min="
                f"{layer_hidden.min():.3f}, max={layer_hidden.max():.3f}"
            )

    # --- Scenario 2: chunked prefill with long prompts --------------------
    long_prompt = " ".join(["word"] * 500)
    chunked_prompts = [
        long_prompt,
        long_prompt + " extra tokens here",
        "Short",
    ]
    outputs = llm.generate(chunked_prompts, sampling_params)

    assert len(outputs) == len(chunked_prompts)
    for output in outputs:
        prompt_len = len(output.prompt_token_ids)
        expected_shape = (prompt_len, num_layers, hidden_size)
        _token_ids, hidden_states = get_and_check_output(output, expected_shape)

        for idx, layer_id in enumerate(expected_layer_ids):
            layer_hidden = hidden_states[:, idx, :]
            assert torch.allclose(
                layer_hidden,
                torch.full_like(layer_hidden, layer_id),
                atol=1e-5,
            ), (
                f"Layer {layer_id} at position {idx} should output "
                f"{float(layer_id)}, but got mean="
                f"{layer_hidden.mean():.3f}, min="
                f"{layer_hidden.min():.3f}, max="
                f"{layer_hidden.max():.3f}. "
                f"prompt_len={prompt_len}, "
                f"max_num_batched_tokens={max_num_batched_tokens}"
            )

    # --- Scenario 3: per-request options ----------------------------------
    max_tokens = 5
    custom_path = os.path.join(tmp_path, "subdir", "custom.safetensors")

    sampling_params_list = [
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            extra_args={
                "kv_transfer_params": {
                    "hidden_states_path": custom_path,
                    "include_output_tokens": True,
                }
            },
        ),
    ]
    per_req_prompts = ["Short", "Medium length"]
    outputs = llm.generate(per_req_prompts, sampling_params_list)

    # First output: prompt-only hidden states, default path
    out0 = outputs[0]
    path0 = out0.kv_transfer_params["hidden_states_path"]
    assert path0 != custom_path
    obj0 = example_hidden_states_connector.load_hidden_states(path0)
    assert torch.equal(obj0["token_ids"], torch.tensor(out0.prompt_token_ids))
    assert obj0["hidden_states"].shape == (
        len(out0.prompt_token_ids),
        num_layers,
        hidden_size,
    )
    example_hidden_states_connector.cleanup_hidden_states(path0)

    # Second output: prompt + output tokens, custom path
    out1 = outputs[1]
    assert out1.kv_transfer_params["hidden_states_path"] == custom_path
    obj1 = example_hidden_states_connector.load_hidden_states(custom_path)
    token_ids = obj1["token_ids"]
    hidden_states = obj1["hidden_states"]
    # The final output token was never an input to the model, so its hidden
    # state is not in the cache — hence the -1.
    total_tokens = len(out1.prompt_token_ids) + len(out1.outputs[0].token_ids) - 1
    assert token_ids.shape[0] == total_tokens
    assert hidden_states.shape == (total_tokens, num_layers, hidden_size)

    # Verify predictable layer values hold for all tokens (prompt + output)
    for idx, layer_id in enumerate(expected_layer_ids):
        layer_hidden = hidden_states[:, idx, :]
        assert torch.allclose(
            layer_hidden,
            torch.full_like(layer_hidden, layer_id),
            atol=1e-5,
        )
    example_hidden_states_connector.cleanup_hidden_states(custom_path)


@needs_cuda  # speccompat: CUDA only
@create_new_process_for_each_test()
def test_extract_hidden_states_qwen35_hybrid_smoke(tmp_path):
    """Smoke test for Qwen3.5 hybrid (mamba + full-attention) models.
    Uses load_format="dummy" to just check shape/plumbing.
    """
    layer_ids = [5, 11, 17]
    hidden_size = 1024  # Qwen/Qwen3.5-0.8B hidden_size

    llm = LLM(
        # speccompat: a local configuration and processor (hidden 1024, 24 layers, as the hub's
        # Qwen/Qwen3.5-0.8B), read with load_format="dummy" as upstream does.
        model=qwen35_0_8b_stand_in(),
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}
            },
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
        },
        max_model_len=256,
        enforce_eager=True,
        # speccompat: 0.1 and a fixed 1 GiB KV cache (upstream: 0.4)
        **SMALL_GPU_SHARE,
        load_format="dummy",
    )

    prompts = ["Hello world", "Test prompt with several tokens"]
    sampling_params = SamplingParams(max_tokens=1, temperature=0.0)
    outputs = llm.generate(prompts, sampling_params)

    assert len(outputs) == len(prompts)
    for output in outputs:
        assert output.kv_transfer_params is not None
        hidden_states_path = output.kv_transfer_params.get("hidden_states_path")
        assert hidden_states_path is not None

        obj = example_hidden_states_connector.load_hidden_states(hidden_states_path)
        token_ids = obj["token_ids"]
        hidden_states = obj["hidden_states"]

        assert torch.equal(token_ids, torch.tensor(output.prompt_token_ids))
        assert hidden_states.shape == (
            len(output.prompt_token_ids),
            len(layer_ids),
            hidden_size,
        )


@pytest.mark.timeout(
    240 if current_platform.is_rocm() or current_platform.is_xpu() else 120
)
@needs_cuda  # speccompat: CUDA only
@multi_gpu_test(num_gpus=2)
@create_new_process_for_each_test()
def test_extract_hidden_states_tp2():
    """Test that hidden states extraction works with tensor_parallel_size=2."""
    tmp_dir = tempfile.mkdtemp()
    layer_ids = [5, 11, 17]
    hidden_size = 1024  # Qwen/Qwen3-0.6B hidden_size

    llm = LLM(
        # speccompat: a local configuration (hidden 1024, 28 layers, as the hub's
        # Qwen/Qwen3-0.6B), read with load_format="dummy" as upstream does.
        model=qwen3_0_6b_stand_in(),
        tensor_parallel_size=2,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}
            },
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": tmp_dir},
        },
        max_model_len=256,
        enforce_eager=True,
        # speccompat: 0.1 and a fixed 1 GiB KV cache (upstream: 0.4)
        **SMALL_GPU_SHARE,
        load_format="dummy",
    )

    prompts = ["Hello world", "Test prompt with several tokens"]
    sampling_params = SamplingParams(max_tokens=1, temperature=0.0)
    outputs = llm.generate(prompts, sampling_params)

    assert len(outputs) == len(prompts)
    for output in outputs:
        assert output.kv_transfer_params is not None
        hidden_states_path = output.kv_transfer_params.get("hidden_states_path")
        assert hidden_states_path is not None

        obj = example_hidden_states_connector.load_hidden_states(hidden_states_path)
        token_ids = obj["token_ids"]
        hidden_states = obj["hidden_states"]

        assert torch.equal(token_ids, torch.tensor(output.prompt_token_ids))
        assert hidden_states.shape == (
            len(output.prompt_token_ids),
            len(layer_ids),
            hidden_size,
        )
