"""Serving the two edge ids of ``extract_hidden_states`` where a decoder stack captures its
aux states only *before* each layer, as ``hidden_states + residual`` (DeepSeek before
vLLM 0.25, every stack on 0.17):

- id 0 (the embeddings): before layer 0 the residual is still ``None``. The embeddings
  are computed once, handed to vLLM's own forward as ``inputs_embeds`` (which it takes
  instead of looking the tokens up) with id 0 hidden from the loop, and a copy is put in
  front of the states vLLM captured, where id 0's slot is (vLLM stacks them in layer
  order).
- id N (the final pre-norm state): the loop never reaches a step N. The last pipeline
  rank's stack gets one more entry, a pass-through "layer" returning
  ``(hidden_states, residual)`` unchanged, so vLLM's own loop appends
  ``hidden_states + residual`` there; the final norm then sees the same tensors as before.

Both are set where the model runner sets the aux layers (``set_aux_hidden_state_layers``),
before any forward, warm-up or compilation, as plain attributes: constants to
``torch.compile``, which traces the wrapped forward like vLLM's own (a property there sent
Dynamo into a recursion on the H200).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..patching import Patcher

AUX_LAYERS = "aux_hidden_state_layers"
# The adapters that serve the edge ids (their records' ids, checked against the catalogue by
# the unit tests): the layer-id check asks ``patching.applied()`` whether they run here.
LLAMA_FAMILY_EDGE_IDS = "vllm.llama_family_edge_ids"
DEEPSEEK_FIRST_LAYER_RESIDUAL = "vllm.deepseek_first_layer_residual"
DEEPSEEK_FINAL_LAYER_CAPTURE = "vllm.deepseek_final_layer_capture"
# Copies id 0 on vLLM's KimiLinearModel stack (Kimi-Linear, Kimi-K3/K3.1) without attention
# residuals: applied, the layer-id check serves id 0 there (``kimi_first_id``).
KIMI_LINEAR_FIRST_LAYER_ALIAS = "vllm.kimi_linear_first_layer_alias"
# The architectures whose stacks ``vllm.llama_family_edge_ids`` patches (LlamaModel,
# Qwen2Model): the layer-id check serves 0..N there where it is applied.
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                          "Qwen3ForCausalLM"})
# Set on the decoder stack where id 0 was asked for.
SERVES_ID_0 = "speccompat_serves_id_0"
# The stack's own forward, kept on its class once wrapped. The wrapper finds it there, not
# in its closure: vLLM's AOT compile cache (torch's aot_compile) pickles the compiled
# forward's closure, a function by its name, and the name ``forward`` now gives the
# wrapper, so the cache was never saved ("it's not the same object"; seen on vLLM 0.32.0,
# CUDA and CPU). A class pickles by its name.
UPSTREAM_FORWARD = "speccompat_upstream_forward"


def final_state_tap() -> Any:
    """A decoder-layer stand-in that changes nothing: one more loop step, no computation."""
    from torch import nn

    class FinalStateTap(nn.Module):  # type: ignore[misc]  # torch is the user's, untyped here
        def forward(self, positions: Any, hidden_states: Any, residual: Any,
                    *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            return hidden_states, residual

    return FinalStateTap()


def add_final_capture(stack: Any, layer_ids: Iterable[int]) -> bool:
    """Give ``stack`` the pass-through step when the final id is asked for on the rank
    that holds the last layer; True if it was added. A second call adds nothing: the
    stack then has one entry more than the final id."""
    num_layers = len(stack.layers)
    if int(stack.end_layer) != num_layers or num_layers not in {int(i) for i in layer_ids}:
        return False
    stack.layers.append(final_state_tap())
    stack.end_layer = num_layers + 1
    return True


def hide_first_id(stack: Any, layer_ids: Iterable[int]) -> None:
    """Leave id 0 out of ``stack``'s aux ids and flag it for :func:`with_first_id`."""
    requested = tuple(int(i) for i in layer_ids)
    setattr(stack, AUX_LAYERS, tuple(i for i in requested if i != 0))
    setattr(stack, SERVES_ID_0, 0 in requested)


def setter_serving(*, first_id: bool, final_id: bool) -> Callable[[Callable[..., Any]],
                                                                   Callable[..., Any]]:
    """A wrapper for a causal LM's ``set_aux_hidden_state_layers`` that prepares its
    ``self.model`` stack to serve id 0 and/or the final id."""
    def wrap(set_layers: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(set_layers)
        def set_aux_hidden_state_layers(self: Any, layers: tuple[int, ...]) -> Any:
            result = set_layers(self, layers)
            if first_id:
                hide_first_id(self.model, layers)
            if final_id:
                add_final_capture(self.model, layers)
            return result

        return set_aux_hidden_state_layers

    return wrap


def serve_first_id(patcher: Patcher, stack: type, get_pp_group: Callable[[], Any]) -> None:
    """Wrap ``stack.forward`` with :func:`with_first_id`; its own forward stays on the class
    as ``UPSTREAM_FORWARD``, where the wrapper finds it."""
    patcher.add(stack, UPSTREAM_FORWARD, inspect.getattr_static(stack, "forward"))
    patcher.wrap(stack, "forward", with_first_id(get_pp_group, stack))


def with_first_id(get_pp_group: Callable[[], Any], stack: type) -> Callable[
        [Callable[..., Any]], Callable[..., Any]]:
    """A wrapper for ``stack``'s ``forward(input_ids, positions, intermediate_tensors,
    inputs_embeds, ...)`` that serves id 0 where :func:`hide_first_id` flagged it;
    ``get_pp_group`` is the model module's own. It calls the forward it replaced through
    ``stack.UPSTREAM_FORWARD`` (see :func:`serve_first_id`), not through its closure."""
    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(forward)
        def forward_with_id_0(self: Any, input_ids: Any, positions: Any,
                              intermediate_tensors: Any = None, inputs_embeds: Any = None,
                              *args: Any, **kwargs: Any) -> Any:
            upstream = getattr(stack, UPSTREAM_FORWARD)
            if not getattr(self, SERVES_ID_0, False) or not get_pp_group().is_first_rank:
                return upstream(self, input_ids, positions, intermediate_tensors,
                                inputs_embeds, *args, **kwargs)
            if inputs_embeds is None:
                inputs_embeds = self.embed_input_ids(input_ids)
            # A copy: the first layer's in-place norms must not reach the captured state.
            first_state = inputs_embeds.clone()
            output = upstream(self, input_ids, positions, intermediate_tensors, inputs_embeds,
                              *args, **kwargs)
            if isinstance(output, tuple):
                hidden_states, captured = output
                return hidden_states, [first_state, *captured]
            if not get_pp_group().is_last_rank:
                return output  # intermediate tensors: the capture is the last rank's to return
            return output, [first_state]

        return forward_with_id_0

    return wrap
