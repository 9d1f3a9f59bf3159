"""vLLM 0.17's ``LlamaModel`` and ``Qwen2Model`` (Llama, Mistral, Qwen2, Qwen3) capture an
aux hidden state only *before* each decoder layer, as ``hidden_states + residual``: the
capture DeepSeek kept until 0.25. Two of the ids ``extract_hidden_states`` means are then
out of reach:

- id 0 (the embeddings): the residual is still ``None`` before layer 0, a TypeError;
- id N = ``num_hidden_layers`` (the final pre-norm state, in speculators' default ids):
  the loop never reaches a step N, so the model returns one state fewer than asked and
  the request fails.

vLLM PR #36063 (0.18.0) moved these stacks to ``EagleModelMixin._maybe_add_hidden_state``,
which captures after each layer and serves 0..N. The adapter serves both edge ids the way
the DeepSeek adapters do (``speccompat.server.aux_edges``): the embeddings are handed to vLLM's
forward as ``inputs_embeds`` and copied into id 0's slot, and the last rank's stack gets a
pass-through step after its last layer, where vLLM's own loop appends the final state.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import module_source, source_def
from ...versions import spec
from ..aux_edges import AUX_LAYERS, LLAMA_FAMILY, serve_first_id, setter_serving

ID = "vllm.llama_family_edge_ids"
SETTER = "set_aux_hidden_state_layers"
# (model module, causal LM whose setter prepares the stack, decoder stack whose forward
# captures). Qwen3Model is a Qwen2Model and MistralForCausalLM a LlamaForCausalLM.
TARGETS: tuple[tuple[str, str, str | None], ...] = (
    ("vllm.model_executor.models.llama", "LlamaForCausalLM", "LlamaModel"),
    ("vllm.model_executor.models.qwen2", "Qwen2ForCausalLM", "Qwen2Model"),
    ("vllm.model_executor.models.qwen3", "Qwen3ForCausalLM", None),
)
# The architectures whose stacks are the two above: the layer-id check serves 0..N there.
ARCHITECTURES = LLAMA_FAMILY
BEFORE_EACH_LAYER = f"if idx in self.{AUX_LAYERS}:"
CAPTURE = "aux_hidden_states.append(hidden_states + residual)"
# What 0.18's stacks have instead (vLLM PR #36063).
MIXIN_CAPTURE = "_maybe_add_hidden_state"


def _stack_problem(module: str, stack: str) -> str | None:
    forward = source_def(module, f"{stack}.forward")
    if forward is None:
        return f"{module}.{stack}.forward not found"
    text = forward.text
    if MIXIN_CAPTURE in text:
        return f"{stack}.forward captures through EagleModelMixin (0..N served)"
    for needed in (BEFORE_EACH_LAYER, CAPTURE, "residual = None",
                   "hidden_states = inputs_embeds",
                   "islice(self.layers, self.start_layer, self.end_layer)"):
        if needed not in text:
            return f"{stack}.forward lacks {needed!r}"
    if "inputs_embeds" not in forward.params:
        return f"{stack}.forward takes no inputs_embeds"
    if "get_pp_group" not in (module_source(module) or ""):
        return f"{module} does not import get_pp_group"
    return None


def _probe() -> str | None:
    for module, _, stack in TARGETS:
        if stack is not None and (problem := _stack_problem(module, stack)):
            return problem
    for module, causal_lm, _ in TARGETS:
        setter = source_def(module, f"{causal_lm}.{SETTER}")
        if setter is None or f"self.model.{AUX_LAYERS} = layers" not in setter.text:
            return f"{module}.{causal_lm}.{SETTER} does not set self.model.{AUX_LAYERS}"
    return None


def _patch(patcher: Patcher) -> None:
    def hook(causal_lm: str, stack: str | None) -> Callable[[ModuleType], None]:
        def on_module(module: ModuleType) -> None:
            patcher.wrap(getattr(module, causal_lm), SETTER,
                         setter_serving(first_id=True, final_id=True))
            if stack is not None:
                serve_first_id(patcher, getattr(module, stack), module.get_pp_group)

        return on_module

    for module, causal_lm, stack in TARGETS:
        patcher.on_import(module, hook(causal_lm, stack))


ADAPTER = Adapter(
    id=ID,
    summary="Llama/Mistral/Qwen2/Qwen3 servers serve ids 0 and num_hidden_layers on vLLM 0.17",
    why="0.17's LlamaModel and Qwen2Model capture only before each layer: id 0 adds a residual "
    "that is still None (TypeError) and the final id is never captured (one state fewer than "
    "asked); speculators' default ids include the final one",
    how="set_aux_hidden_state_layers hides id 0 from the stack and adds a pass-through step "
    "after its last layer; the stack's forward computes the embeddings, passes them as "
    "inputs_embeds and puts a copy in id 0's slot",
    upstream="vLLM 0.17.0: extract_hidden_states over the EAGLE-3 capture before each layer; "
    "0.18.0 captures after each layer through EagleModelMixin, serving 0..N",
    upstream_ref="vLLM PR #36063 (0.18.0)",
    vllm=spec(">=0.17.0,<0.18.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.18.0 is the oldest supported release",
)
