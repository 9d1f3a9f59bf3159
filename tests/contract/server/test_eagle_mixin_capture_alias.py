"""``EagleModelMixin._maybe_add_hidden_state`` (vLLM 0.18.0 onwards) appends ``hidden_states``
itself where the residual is ``None``: id 0, the embeddings. ``LlamaDecoderLayer`` then takes
that tensor as its residual (``residual = hidden_states``) and its post-attention norm adds
into it in place on CUDA (``vllm_c``'s fused add-RMSNorm, ``torch.ops._C.fused_add_rms_norm``):
in an ``--enforce-eager`` CUDA server id 0's slot holds the final pre-norm state. The adapter
gives the mixin a copy where the residual is ``None``.

vLLM's CPU build routes its fused add-RMSNorm through the functional native op, so no CPU
server aliases; these tests drive vLLM's own mixin method and vLLM's own in-place kernel
(``vllm._custom_ops.fused_add_rms_norm``, which the CPU build ships) in the order the first
decoder layer runs them. The same sequence on CUDA, through a real eager server, is
tests/gpu/test_gpu_id0_modes.py."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.record import ExtractionPath
from speccompat.server.adapters.eagle_mixin_capture_alias import (
    ALIASING_LINE,
    ID,
    INTERFACES,
    METHOD,
    MIXIN,
    UPSTREAM,
    _probe,
)
from support import needs_adapter, requires_vllm, runs_models, source_text

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM before 0.18.0 captures before each layer, without the mixin")
LLAMA = "vllm.model_executor.models.llama"
HIDDEN = 64
TOKENS = 9


def _stack(ids: tuple[int, ...]) -> Any:
    """vLLM's own mixin (no ``__init__`` of its own) with its aux ids set by its own setter."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    stack = EagleModelMixin()
    stack._set_aux_hidden_state_layers(ids)
    return stack


def _first_layer(stack: Any, embeddings: Any) -> list[Any]:
    """Id 0's capture, then what LlamaDecoderLayer does to its residual in layer 0 on CUDA:
    ``residual = hidden_states``, then the post-attention fused add-RMSNorm in place."""
    import torch
    from vllm import _custom_ops as ops

    captured = getattr(stack, METHOD)([], 0, embeddings, None)
    residual = embeddings  # LlamaDecoderLayer: residual is None -> residual = hidden_states
    attention_out = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))
    ops.fused_add_rms_norm(attention_out, residual, torch.ones(HIDDEN), 1e-6)
    return list(captured)


def _embeddings() -> Any:
    import torch

    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(0))


@applies
def test_raw_the_mixin_appends_the_state_itself() -> None:
    method = source_text(INTERFACES, f"{MIXIN}.{METHOD}")
    assert ALIASING_LINE in method
    layer = source_text(LLAMA, "LlamaDecoderLayer.forward")
    assert "residual = hidden_states" in layer
    assert "self.post_attention_layernorm(hidden_states, residual)" in layer
    assert _probe() is None
    embeddings = _embeddings()
    captured = _stack((0, 2))._maybe_add_hidden_state([], 0, embeddings, None)
    assert captured[0] is embeddings


@applies
@runs_models
def test_raw_the_first_layer_overwrites_id_0() -> None:
    """Without the adapter: vLLM's in-place kernel reaches the captured id 0."""
    embeddings = _embeddings()
    before = embeddings.clone()
    captured = _first_layer(_stack((0, 2)), embeddings)
    assert not captured[0].equal(before), "the in-place add did not reach id 0"
    assert captured[0] is embeddings


@applies
@runs_models
def test_normalized_id_0_keeps_the_embeddings() -> None:
    import torch

    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED, report
        embeddings = _embeddings()
        before = embeddings.clone()
        stack = _stack((0, 2))
        captured = _first_layer(stack, embeddings)
        assert captured[0].equal(before), "id 0 is not the embeddings"
        assert not embeddings.equal(before), "the first layer's residual is updated in place"
        # A state with a residual is vLLM's own sum; an id not asked for adds nothing.
        residual = torch.ones(TOKENS, HIDDEN)
        summed = stack._maybe_add_hidden_state([], 2, embeddings, residual)
        assert summed[0].equal(embeddings + residual)
        assert stack._maybe_add_hidden_state([], 1, embeddings, None) == []
    finally:
        speccompat.revert()


@applies
def test_the_replacement_pickles_by_name_and_revert_restores() -> None:
    """vLLM's AOT compile cache pickles functions by name (see aux_edges.UPSTREAM_FORWARD):
    the replacement is a module-level function and finds vLLM's method on the class."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    own = vars(EagleModelMixin)[METHOD]
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED, report
        replacement = vars(EagleModelMixin)[METHOD]
        assert replacement is not own and vars(EagleModelMixin)[UPSTREAM] is own
        assert pickle.loads(pickle.dumps(replacement)) is replacement
        assert replacement.__closure__ is None
    finally:
        speccompat.revert()
    assert vars(EagleModelMixin)[METHOD] is own and UPSTREAM not in vars(EagleModelMixin)


@pytest.mark.parametrize("stack_module", [LLAMA, "vllm.model_executor.models.qwen2"])
@applies
def test_the_stacks_capture_id_0_through_the_mixin_without_a_residual(stack_module: str) -> None:
    """Llama/Mistral and Qwen2/Qwen3 (the tested architectures) reach the aliasing line: the
    first rank's residual is None where the stack captures its first id."""
    stack = "LlamaModel" if stack_module == LLAMA else "Qwen2Model"
    forward = source_text(stack_module, f"{stack}.forward")
    assert "residual = None" in forward
    assert "self._maybe_add_hidden_state(" in forward
    assert forward.index("residual = None") < forward.index("self._maybe_add_hidden_state(")
