"""``DeepseekV2Model`` (DeepSeek V2/V3, Kimi-K2.x, GLM-MoE-DSA) captures aux id k as
``hidden_states + residual`` before decoder layer k, but before layer 0 the residual is
still ``None``: with id 0 (the embeddings, HF ``output_hidden_states[0]``) an
``extract_hidden_states`` server raises a TypeError at warm-up (vLLM 0.26) or at the first
request (0.32). Every release with the capture, 0.18.0 to 0.33.0 at least, has it.

The state vLLM means there is the embeddings themselves. The adapter computes them once,
hands them to vLLM's own forward as ``inputs_embeds`` (so nothing is computed twice) with
id 0 hidden from the loop, and puts a copy in id 0's slot (``speccompat.server.aux_edges``, shared
with ``llama_family_edge_ids``).
"""

from __future__ import annotations

from types import ModuleType

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import module_source, source_def
from ...versions import spec
from ..aux_edges import AUX_LAYERS, serve_first_id, setter_serving

ID = "vllm.deepseek_first_layer_residual"
DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
MODEL = "DeepseekV2Model"
CAUSAL_LM = "DeepseekV2ForCausalLM"
SETTER = "set_aux_hidden_state_layers"


def _probe() -> str | None:
    forward = source_def(DEEPSEEK, f"{MODEL}.forward")
    if forward is None:
        return f"{DEEPSEEK}.{MODEL}.forward not found"
    text = forward.text
    if "residual = None" not in text:
        return f"{MODEL}.forward no longer starts the residual at None"
    if "inputs_embeds" not in forward.params:
        return f"{MODEL}.forward takes no inputs_embeds"
    if "hidden_states = inputs_embeds" not in text:
        return f"{MODEL}.forward does not use inputs_embeds in place of the token lookup"
    adds = ("aux_hidden_states.append(hidden_states + residual)",
            "aux_hidden_state = hidden_states + residual")
    if not any(add in text for add in adds):
        return f"{MODEL}.forward does not capture hidden_states + residual"
    if f"if idx in self.{AUX_LAYERS}" not in text:
        return f"{MODEL}.forward does not test idx in self.{AUX_LAYERS}"
    setter = source_def(DEEPSEEK, f"{CAUSAL_LM}.{SETTER}")
    if setter is None or f"self.model.{AUX_LAYERS} = layers" not in setter.text:
        return f"{CAUSAL_LM}.{SETTER} does not set self.model.{AUX_LAYERS}"
    if "get_pp_group" not in (module_source(DEEPSEEK) or ""):
        return f"{DEEPSEEK} does not import get_pp_group"
    return None


def _patch(patcher: Patcher) -> None:
    def on_deepseek(module: ModuleType) -> None:
        patcher.wrap(getattr(module, CAUSAL_LM), SETTER,
                     setter_serving(first_id=True, final_id=False))
        serve_first_id(patcher, getattr(module, MODEL), module.get_pp_group)

    patcher.on_import(DEEPSEEK, on_deepseek)


ADAPTER = Adapter(
    id=ID,
    summary="DeepSeek/Kimi servers capture id 0 (the embeddings)",
    why="DeepseekV2Model adds a residual that is still None before its first layer: id 0 "
    "raises a TypeError at warm-up (0.26) or at the first request (0.32)",
    how="set_aux_hidden_state_layers leaves id 0 out of the stack's ids and flags it; "
    "DeepseekV2Model.forward then computes the embeddings, passes them to vLLM's forward as "
    "inputs_embeds and puts a copy in id 0's slot",
    upstream="vLLM 0.18.0: DeepseekV2Model gains the EAGLE-3 aux capture as hidden_states + "
    "residual before each layer, residual None before the first",
    upstream_ref="none found: no vLLM issue or PR on DeepSeek aux id 0 as of vLLM 0.33.0",
    vllm=spec(">=0.18.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM's DeepseekV2Model captures id 0 without a residual",
)
