"""``EagleModelMixin._maybe_add_hidden_state`` (vLLM 0.18.0 onwards, PR #36063) captures an
aux state as ``hidden_states + residual``, a tensor of its own, but where the residual is
``None`` it appends ``hidden_states`` itself. That is id 0 (the embeddings) on the first
pipeline rank of every stack built on the mixin, and every id of stacks that pass no
residual at all. The first decoder layer then takes that very tensor as its residual, and
on CUDA the in-place fused add-RMSNorm (``torch.ops._C.fused_add_rms_norm``, vLLM's
``vllm_c`` provider) of every later layer adds into it: in an ``--enforce-eager`` server
id 0's slot comes back as the final pre-norm state, digit for digit, with HTTP 200 and the
right shape. Compiled servers (the default) do not alias; nor does vLLM's CPU build, whose
fused add-RMSNorm is the functional native one.

The mixin serves every stack that captures through it. In vLLM 0.26.0 (``model_executor/
models/``): afmoe, apertus, arcee, gemma4, gpt_oss, hunyuan_v1, laguna, llama (Llama,
Mistral), mimo_v2, minicpm, minimax_m2, moss_audio, nemotron_h, qwen2 (Qwen2, Qwen3),
qwen3_moe, qwen3_next, qwen3_vl, qwen3_vl_moe and step1; 0.34.0 adds granite,
granitemoe, granitemoeshared, interns2_mobius, nemotron_parse3_5, plamo3 and
``vllm/models/beam`` (whose stacks pass no residual for any id). The adapter patches the
mixin once: where the residual is ``None`` and the id is asked for, the state is cloned
before vLLM's own method appends it. Cost: one copy of one layer's rows per forward, only
where such an id is asked for, and in eager servers about 3 us of host time per forward
(``bench/capture_alias_overhead.py``; compiled ones trace it into the graph). The
replacement is a module-level function and calls vLLM's method through the class
(``UPSTREAM``), so vLLM's AOT compile cache can pickle it by name.
DeepSeek's own capture and 0.17's are served by ``deepseek_first_layer_residual`` and
``llama_family_edge_ids``, whose id-0 state is a copy already (``aux_edges.with_first_id``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import source_def
from ...versions import spec

ID = "vllm.eagle_mixin_capture_alias"
INTERFACES = "vllm.model_executor.models.interfaces"
MIXIN = "EagleModelMixin"
METHOD = "_maybe_add_hidden_state"
# vLLM's method, kept on the mixin while patched (found by name, not through a closure).
UPSTREAM = "speccompat_upstream_maybe_add_hidden_state"
# The line that appends the tensor itself where there is no residual (0.18.0 .. 0.34.0).
ALIASING_LINE = "value = hidden_states + residual if residual is not None else hidden_states"


def _maybe_add_hidden_state(self: Any, aux_hidden_states: list[Any], layer_idx: int,
                            hidden_states: Any, residual: Any) -> list[Any]:
    """vLLM's method, given a copy of a state it would otherwise append itself."""
    if residual is None and layer_idx in self.aux_hidden_state_layers:
        # The first layer keeps this tensor as its residual and adds into it in place.
        hidden_states = hidden_states.clone()
    upstream = getattr(self, UPSTREAM)
    return upstream(aux_hidden_states, layer_idx, hidden_states, residual)  # type: ignore[no-any-return]


def _probe() -> str | None:
    method = source_def(INTERFACES, f"{MIXIN}.{METHOD}")
    if method is None:
        return f"{INTERFACES}.{MIXIN}.{METHOD} not found"
    if ALIASING_LINE not in method.text or "aux_hidden_states.append(value)" not in method.text:
        return f"{MIXIN}.{METHOD} no longer appends hidden_states itself where residual is None"
    if list(method.params) != ["self", "aux_hidden_states", "layer_idx", "hidden_states",
                               "residual"]:
        return f"{MIXIN}.{METHOD} takes {list(method.params)}"
    return None


def _patch(patcher: Patcher) -> None:
    def on_interfaces(module: ModuleType) -> None:
        mixin = getattr(module, MIXIN)
        patcher.add(mixin, UPSTREAM, vars(mixin)[METHOD])
        patcher.replace(mixin, METHOD, _maybe_add_hidden_state)

    patcher.on_import(INTERFACES, on_interfaces)


ADAPTER = Adapter(
    id=ID,
    summary="id 0 (and any state captured without a residual) is a copy, not the "
    "embeddings tensor the first layer updates in place",
    why="EagleModelMixin appends hidden_states itself where the residual is None; on CUDA "
    "the first layer takes it as its residual and in-place fused add-RMSNorms update it: "
    "in eager servers id 0's slot holds the final pre-norm state, silently",
    how="EagleModelMixin._maybe_add_hidden_state clones the state where the residual is None "
    "and the id is asked for, then calls vLLM's method",
    upstream="vLLM 0.18.0: Llama/Qwen-family stacks capture through "
    "EagleModelMixin._maybe_add_hidden_state, which appends the embeddings tensor for id 0",
    upstream_ref="vLLM PR #36063 (0.18.0); none found on the aliasing itself as of 0.34.0",
    vllm=spec(">=0.18.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM's EagleModelMixin captures a state of its own where the residual is "
    "None",
)
