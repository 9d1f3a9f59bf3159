"""vLLM's ``KimiLinearModel`` (``vllm/models/kimi_k3/nvidia/model.py``, 0.27.0 onwards; the
stack of ``KimiLinearForCausalLM``, ``KimiK3ForConditionalGeneration`` and
``KimiK31ForConditionalGeneration``) captures id 0 itself, not through
``EagleModelMixin._maybe_add_hidden_state`` (so ``vllm.eagle_mixin_capture_alias`` does not
reach it)::

    if self.use_attn_res or residual is None:
        aux_hidden_states.append(hidden_states)      # the embeddings tensor, no copy

Without attention residuals (``config.attn_res_block_size is None``: Kimi-Linear's
checkpoints, K3 configs with them off) the first ``KimiDecoderLayer._pre_attn_norm`` then
takes that very tensor as its residual (``residual = hidden_states``) and
``_post_attn_norm``'s fused add-RMSNorm adds into it in place: id 0's slot holds the first
layer's update (H200, vLLM 0.34.0, eager: max |diff| 4.18-4.44 from the embeddings). With
attention residuals on, the embeddings go to ``prefix_sum`` and nothing writes into them.

The adapter replaces ``KimiDecoderLayer._pre_attn_norm`` with a module-level function that,
where the residual is ``None`` (the first layer on the first pipeline rank) and the layer does
not use attention residuals (``self.use_attn_res``, set in ``KimiDecoderLayer.__init__`` from
``config.attn_res_block_size``), gives vLLM's own method a clone of ``hidden_states``: the
layer's residual is then a tensor of its own and the captured embeddings stay as they were.
Cost: one copy of the first layer's input rows per forward, on the first pipeline rank, and
only without attention residuals; every other layer's call (a residual is given) and every
attention-residual model passes straight through. The layer cannot tell whether id 0 was asked
for, so the copy is made in every ``extract_hidden_states`` server on this stack.

Compiled mode: the branch is a plain Python test of ``residual is None`` and of a bool
attribute, which Dynamo specializes at trace time (no data-dependent branching); vLLM's method
is kept on the class (``UPSTREAM``) and found by name, so vLLM's AOT compile cache can pickle
the replacement by its qualified name (as ``eagle_mixin_capture_alias``). Whether the copy
survives compilation (and CUDA graphs) is what the H200 run checks
(tests/gpu/test_gpu_new_architectures.py, ``test_serve_every_id[kimi_k3_no_attn_res-compiled]``).

With this adapter applied the layer-id check serves id 0 on this stack
(``servable_aux_ids(..., kimi_first_id_copied=True)``); skipped
(``SPECCOMPAT_SKIP=vllm.kimi_linear_first_layer_alias``) id 0 is refused again
(``server/kimi_first_id.py``).
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import source_def
from ...versions import spec

ID = "vllm.kimi_linear_first_layer_alias"
MODEL = "vllm.models.kimi_k3.nvidia.model"
STACK = "KimiLinearModel"
LAYER = "KimiDecoderLayer"
METHOD = "_pre_attn_norm"
PARAMS = ["self", "hidden_states", "residual", "prefix_sum"]
# vLLM's method, kept on the layer class while patched (found by name, not through a closure).
UPSTREAM = "speccompat_upstream_pre_attn_norm"
# The capture that appends the embeddings tensor itself (0.27.0 .. 0.34.0).
ALIASING_CAPTURE = re.compile(
    r"if self\.use_attn_res or residual is None:\n\s+aux_hidden_states\.append\(hidden_states\)\n")
# _pre_attn_norm without attention residuals: the first layer's residual is its input.
FIRST_RESIDUAL = re.compile(
    r"if not self\.use_attn_res:.*?if residual is None:\n\s+residual = hidden_states\n", re.S)
# The layer decides attention residuals from the config's block size.
LAYER_FLAG = "self.use_attn_res = attn_res_block_size is not None"


def _pre_attn_norm(self: Any, hidden_states: Any, residual: Any, prefix_sum: Any) -> Any:
    """vLLM's method, given a copy of the first layer's input where that input is the
    captured id 0 (no residual yet, no attention residuals)."""
    if residual is None and hidden_states is not None and not self.use_attn_res:
        # vLLM makes this tensor the residual, and _post_attn_norm adds into it in place.
        hidden_states = hidden_states.clone()
    upstream = getattr(self, UPSTREAM)
    return upstream(hidden_states, residual, prefix_sum)


def _probe() -> str | None:
    forward = source_def(MODEL, f"{STACK}.forward")
    if forward is None:
        return f"{MODEL}.{STACK}.forward not found"
    if ALIASING_CAPTURE.search(forward.text) is None:
        return (f"{STACK}.forward no longer appends hidden_states itself for its first id "
                "where there are attention residuals or no residual")
    method = source_def(MODEL, f"{LAYER}.{METHOD}")
    if method is None:
        return f"{MODEL}.{LAYER}.{METHOD} not found"
    if list(method.params) != PARAMS:
        return f"{LAYER}.{METHOD} takes {list(method.params)}, not {PARAMS}"
    if FIRST_RESIDUAL.search(method.text) is None:
        return (f"{LAYER}.{METHOD} no longer sets residual = hidden_states where there is no "
                "residual and no attention residuals")
    init = source_def(MODEL, f"{LAYER}.__init__")
    if init is None or LAYER_FLAG not in init.text:
        return f"{LAYER}.__init__ no longer sets {LAYER_FLAG!r}"
    layer_forward = source_def(MODEL, f"{LAYER}.forward")
    if layer_forward is None or f"self.{METHOD}(" not in layer_forward.text:
        return f"{LAYER}.forward no longer calls self.{METHOD}"
    return None


def _patch(patcher: Patcher) -> None:
    def on_model(module: ModuleType) -> None:
        layer = getattr(module, LAYER)
        patcher.add(layer, UPSTREAM, vars(layer)[METHOD])
        patcher.replace(layer, METHOD, _pre_attn_norm)

    patcher.on_import(MODEL, on_model)


ADAPTER = Adapter(
    id=ID,
    summary="Kimi-Linear/K3 id 0 without attention residuals is a copy, not the embeddings "
    "tensor the first layer updates in place",
    why="KimiLinearModel.forward appends the embeddings tensor itself as id 0; without "
    "attention residuals the first KimiDecoderLayer takes it as its residual and its fused "
    "add-RMSNorm adds into it in place: id 0 holds the first layer's update (H200, vLLM "
    "0.34.0, eager: max |diff| 4.18-4.44), silently",
    how="KimiDecoderLayer._pre_attn_norm clones hidden_states where the residual is None and "
    "the layer has no attention residuals (the first layer only), then calls vLLM's method",
    upstream="vLLM 0.27.0: vllm/models/kimi_k3/nvidia/model.py's KimiLinearModel captures "
    "id 0 as the embeddings tensor itself, which its first layer then takes as its residual "
    "(KimiK3ForConditionalGeneration SupportsEagle3 from 0.27.0, KimiLinearForCausalLM from "
    "0.28.0, KimiK31ForConditionalGeneration from 0.34.0; the module is new in 0.27.0, "
    "before it KimiLinearModel captured nothing)",
    upstream_ref="none found: no vLLM issue or PR on the aliasing as of vLLM 0.34.0; the code: "
    "vllm/models/kimi_k3/nvidia/model.py (0.34.0): KimiLinearModel.forward "
    ":1235-1236 (`if self.use_attn_res or residual is None: "
    "aux_hidden_states.append(hidden_states)`), KimiDecoderLayer.__init__ :823 "
    "(`self.use_attn_res = attn_res_block_size is not None`), _pre_attn_norm :859-868 "
    "(`residual = hidden_states`), _post_attn_norm :896-899 (fused add-RMSNorm), forward "
    ":931",
    vllm=spec(">=0.27.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM's KimiLinearModel captures a copy of id 0 (or its first layer stops "
    "taking the captured tensor as the residual it adds into in place)",
)
