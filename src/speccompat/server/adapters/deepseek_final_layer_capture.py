"""Before vLLM 0.25.0, ``DeepseekV2Model`` (DeepSeek V2/V3, Kimi-K2.x, GLM-MoE-DSA) captures
an aux hidden state only before each decoder layer, so the final id ``num_hidden_layers``
(the final pre-norm state, in speculators' default ids) is never captured: an
``extract_hidden_states`` server starts without a word and its engine dies at the first
request ("The expanded size of the tensor (4) must match the existing size (3)"). vLLM PR
#46973 (0.25.0) added the capture after the last layer.

The adapter lets vLLM's own loop capture it: when the final id is asked for, the last
pipeline rank's decoder stack gets one more entry, a pass-through "layer", and the loop
runs one step further, where vLLM itself appends ``hidden_states + residual`` (the final
pre-norm state, exactly what 0.25's capture appends; ``speccompat.server.aux_edges``, shared with
``llama_family_edge_ids``). It is added to the live model where the model runner sets the
aux layers; ``revert()`` restores the method, and models built afterwards are untouched.
"""

from __future__ import annotations

from types import ModuleType

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import source_def
from ...versions import spec
from ..aux_edges import setter_serving

ID = "vllm.deepseek_final_layer_capture"
DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
CAUSAL_LM = "DeepseekV2ForCausalLM"
SETTER = "set_aux_hidden_state_layers"
# What 0.18-0.24 have (the capture before each layer) and 0.25 added (after the last).
BEFORE_EACH_LAYER = "if idx in self.aux_hidden_state_layers:"
AFTER_THE_LAST = "if self.end_layer in self.aux_hidden_state_layers"


def _probe() -> str | None:
    forward = source_def(DEEPSEEK, "DeepseekV2Model.forward")
    if forward is None:
        return f"{DEEPSEEK}.DeepseekV2Model.forward not found"
    if AFTER_THE_LAST in forward.text:
        return "DeepseekV2Model.forward already captures the state after its last layer"
    if BEFORE_EACH_LAYER not in forward.text or "islice(self.layers, self.start_layer, " \
            "self.end_layer)" not in forward.text:
        return "DeepseekV2Model.forward does not loop over layers[start_layer:end_layer] " \
            "capturing before each layer"
    if source_def(DEEPSEEK, f"{CAUSAL_LM}.{SETTER}") is None:
        return f"{DEEPSEEK}.{CAUSAL_LM}.{SETTER} not found"
    return None


def _patch(patcher: Patcher) -> None:
    def on_deepseek(module: ModuleType) -> None:
        patcher.wrap(getattr(module, CAUSAL_LM), SETTER,
                     setter_serving(first_id=False, final_id=True))

    patcher.on_import(DEEPSEEK, on_deepseek)


ADAPTER = Adapter(
    id=ID,
    summary="DeepSeek/Kimi servers capture the final id (num_hidden_layers) before vLLM 0.25",
    why="before 0.25 DeepseekV2Model captures only before each layer: with the final id the "
    "engine dies at the first request (expanded size 4 vs 3); it is in speculators' default ids",
    how="where the runner sets the aux layers, the last rank's decoder stack gets a "
    "pass-through step after its last layer, so vLLM's own loop appends hidden_states + "
    "residual there",
    upstream="vLLM 0.18.0: DeepseekV2Model gains the EAGLE-3 aux capture, before each layer "
    "only; 0.25.0 adds the capture after the last layer",
    upstream_ref="vLLM PR #46973 (0.25.0)",
    vllm=spec(">=0.18.0,<0.25.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.25.0 is the oldest supported release",
)
