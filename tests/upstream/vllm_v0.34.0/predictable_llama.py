# ruff: noqa
# vLLM's own tests/v1/kv_connector/extract_hidden_states_integration/predictable_llama.py at
# v0.32.0, carried by speccompat to vLLM 0.34.0 (issue #35's tests/upstream), for the CUDA
# host: the model test_extraction.py loads by file name (predictable_llama:...).
# PROVENANCE: NOT a copy of vLLM's 0.34.0 file: no source of vLLM 0.34.0's tests could be
# taken here (PyPI has no vllm or vllm_tpu 0.34.0 source distribution; vllm_tpu stops at
# 0.32.0). The base is this repository's 0.32.0 copy (tests/upstream/vllm_v0.32.0/, from
# vllm_tpu-0.32.0.tar.gz; its source is
# https://github.com/vllm-project/vllm/blob/5df63a720/tests/v1/kv_connector/extract_hidden_states_integration/predictable_llama.py),
# checked against the vLLM modules of the CUDA wheel
# vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl (vllm/_version.py: 0.34.0, commit
# g62d4bc3c7). What upstream's own 0.34.0 file holds is not known here.
# How to run: the header of test_extraction.py beside this file.
# License: Apache-2.0, as the SPDX lines below say (vLLM's).
# A helper the tests import; its code is vLLM's 0.32.0 code, unchanged: vLLM 0.34.0 keeps
# what it uses (EagleModelMixin.aux_hidden_state_layers, LlamaForCausalLM._init_model(
# vllm_config, prefix, layer_type), VocabParallelEmbedding,
# make_empty_intermediate_tensors_factory, vllm.sequence.IntermediateTensors); it imports
# cleanly against 0.34.0. Not run here (no GPU): the CUDA host runs it.
# Nothing adapted.
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

"""Predictable dummy model for testing extract_hidden_states.

Subclasses LlamaForCausalLM but overrides the model to produce deterministic
hidden states: layer i outputs values equal to (i).
"""

from collections.abc import Iterable

import torch
import torch.nn as nn

from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import EagleModelMixin
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.sequence import IntermediateTensors


class PredictableLlamaModel(nn.Module, EagleModelMixin):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        self.config = vllm_config.model_config.hf_config

        # Create minimal embed_tokens for embedding
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            VocabParallelEmbedding,
        )

        self.embed_tokens = VocabParallelEmbedding(
            self.config.vocab_size,
            self.config.hidden_size,
        )

        # Required for pipeline parallelism
        from vllm.model_executor.models.utils import (
            make_empty_intermediate_tensors_factory,
        )

        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], self.config.hidden_size
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed input IDs."""
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
        **extra_layer_kwargs,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward pass that produces predictable outputs.

        Returns:
            If aux_hidden_state_layers is set: (hidden_states, aux_hidden_states)
            Otherwise: hidden_states

        """
        # Determine sequence length
        if inputs_embeds is not None:
            seq_len = inputs_embeds.shape[0]
            device = inputs_embeds.device
        elif input_ids is not None:
            seq_len = input_ids.shape[0] if input_ids.ndim == 1 else input_ids.shape[-1]
            device = input_ids.device
        else:
            raise ValueError("Either input_ids or inputs_embeds must be provided")

        # Final hidden states (last layer value)
        hidden_states = torch.full(
            (seq_len, self.config.hidden_size),
            fill_value=float(self.config.num_hidden_layers),
            device=device,
            dtype=torch.bfloat16,
        )

        # Check if we need auxiliary hidden states
        if len(self.aux_hidden_state_layers) > 0:
            aux_hidden_states = []
            for layer_idx in self.aux_hidden_state_layers:
                # Fill with (layer_idx) for predictability
                layer_hidden = torch.full(
                    (seq_len, self.config.hidden_size),
                    fill_value=float(layer_idx),
                    device=device,
                    dtype=torch.bfloat16,
                )
                aux_hidden_states.append(layer_hidden)

            return hidden_states, aux_hidden_states

        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Skip weight loading."""
        return set()


class PredictableLlamaForCausalLM(LlamaForCausalLM):
    """Predictable Llama model for testing.

    Overrides _init_model to use PredictableLlamaModel instead of LlamaModel.
    """

    def _init_model(
        self,
        vllm_config: VllmConfig,
        prefix: str = "",
        layer_type: type[nn.Module] | None = None,
    ):
        """Initialize with predictable model."""
        return PredictableLlamaModel(vllm_config=vllm_config, prefix=prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Skip weight loading for dummy model."""
        return set()
