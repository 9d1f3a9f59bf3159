"""The server path's layer ids: which ``eagle_aux_hidden_state_layer_ids`` one installed
vLLM serves for one model (the version boundaries read from the releases' model sources),
checked by ``adapters/extract_hidden_states_layer_ids.py`` at start-up. The conventions
themselves (old speculators ids vs vLLM aux ids) are the users', in ``speccompat.layers``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..layers import LayerIdError, _as_int, _num_layers, aux_slot_order
from .kimi_first_id import first_id_limit

# Architectures whose decoder stack is vLLM's DeepseekV2Model (DeepSeek V2/V3, Kimi-K2.x),
# the model class speccompat's deepseek_first_layer_residual and deepseek_final_layer_capture
# patch; less the two DeepSeek stacks below, which are not DeepseekV2Model.
_DEEPSEEK_FAMILY = ("Deepseek", "KimiK2")
# DeepSeek-V4 and V4.1 (DeepseekV4ForCausalLM from vLLM 0.20.0, with an aux capture from
# 0.25.0; DeepseekV4ForConditionalGeneration and DeepseekV41ForCausalLM from 0.30.0, which wrap
# a DeepseekV4Model text model): DeepseekV4Model captures the state after each layer
# (``idx + 1 in aux_hidden_state_layers``; V4.1's next layer hands it back through
# ``capture_previous_aux``, None for layer 0) and the final state, never id 0, on every
# platform (nvidia, amd, xpu, cpu), and no speccompat adapter patches it.
_DEEPSEEK_V4 = "DeepseekV4"
# DeepSeek-V3.2: DeepseekV2Model's DeepseekV3ForCausalLM until 0.28; from 0.29.0 its own
# DeepseekV32Model on CUDA and ROCm (vllm.models.deepseek_v32; DeepseekV2Model still on CPU
# and XPU), which captures id 0 itself (``hidden_states`` while the residual is None) but not
# the final state.
_DEEPSEEK_V32 = "DeepseekV32ForCausalLM"
_DEEPSEEK_V32_OWN_MODEL = "0.29.0"


@dataclass(frozen=True)
class ServableIds:
    """The vLLM aux ids one installed vLLM can serve for one model, and why not the rest."""

    low: int
    high: int
    limits: tuple[str, ...]

    def check(self, ids: Iterable[object], where: str) -> list[int]:
        """The slots ``ids`` give (:func:`~speccompat.layers.aux_slot_order`), or a
        :class:`LayerIdError` naming the first id outside ``low..high`` and the range. Order
        and repeats are accepted: the slots follow layer order, as vLLM >= 0.30 writes them."""
        checked = [_as_int(raw, f"{where} at position {at}") for at, raw in enumerate(ids)]
        valid = f"{self.low}..{self.high}" + (f" ({'; '.join(self.limits)})"
                                               if self.limits else "")
        for at, layer_id in enumerate(checked):
            if not self.low <= layer_id <= self.high:
                raise LayerIdError(f"{where}: id {layer_id} (position {at}) cannot be served",
                                   valid,
                                   f"Choose ids in {self.low}..{self.high}.")
        return aux_slot_order(checked)


def servable_aux_ids(architecture: str, num_layers: int, vllm_version: str, *,
                     first_id_repaired: bool = False,
                     final_id_repaired: bool = False,
                     kimi_first_id_copied: bool = False,
                     config: object | None = None) -> ServableIds:
    """Which ``eagle_aux_hidden_state_layer_ids`` vLLM's ``extract_hidden_states`` serves for
    ``architecture`` on ``vllm_version`` (id k = input of decoder layer k, id
    ``num_layers`` = the final pre-norm state), from the releases' model sources:

    - DeepSeek V2/V3 and Kimi-K2.x (``DeepseekV2Model``): id 0 adds a residual that does not
      exist yet before the first layer (TypeError, every release 0.18.0 to 0.33.0); id
      ``num_layers`` is captured only from 0.25.0 (vLLM PR #46973), before it the model
      returns one state fewer than asked and the request fails.
    - DeepSeek-V4/V4.1 (``DeepseekV4*``, ``DeepseekV4Model``): 1..``num_layers`` on every
      release (0.25.0 to 0.34.0 read): the capture happens after each layer only, so id 0 is
      never returned (the model gives one state fewer than asked; Model Runner V2 stops at
      the first request: "Expected N+1 auxiliary hidden states, got N"), whatever
      speccompat's DeepSeek adapters do (they patch ``DeepseekV2Model``).
    - DeepSeek-V3.2 (``DeepseekV32ForCausalLM``): as V2/V3 before 0.29.0; from 0.29.0 CUDA
      and ROCm run ``DeepseekV32Model``, which serves id 0 itself but never the final id
      (CPU and XPU keep ``DeepseekV2Model``): id 0 as V2/V3 (served once the first-layer
      adapter applies, which covers both), id ``num_layers`` refused.
    - Every other architecture: 0..``num_layers``, except on 0.17.x, where the capture
      happens only before each layer (so ``num_layers`` never matches) and adds the
      residual that is still None before layer 0.

    ``first_id_repaired`` / ``final_id_repaired``: speccompat's adapters for this
    architecture (DeepSeek's ``deepseek_first_layer_residual`` and
    ``deepseek_final_layer_capture``; 0.17's ``llama_family_edge_ids``) are applied in the
    process that runs the model, so those ids are served after all.

    ``config``: the target model's config. Kimi-Linear and Kimi-K3/K3.1 (vLLM's
    ``KimiLinearModel``) without attention residuals: id 0 only where
    ``kimi_first_id_copied`` (speccompat's ``kimi_linear_first_layer_alias`` is applied in
    the process that runs the model), refused otherwise (``kimi_first_id``); the DeepSeek
    and 0.17 flags do not lift that refusal.
    """
    from packaging.version import Version

    version = Version(Version(vllm_version).base_version)
    n = _num_layers(num_layers)
    limits: list[str] = []
    low, high = 0, n
    if architecture.startswith(_DEEPSEEK_V4):
        low = 1
        limits.append(f"id 0 is never captured by {architecture} (DeepseekV4Model captures "
                      f"after each layer only) on vLLM {version}")
    elif architecture.startswith(_DEEPSEEK_FAMILY):
        if not first_id_repaired:
            low = 1
            limits.append(f"id 0 breaks {architecture}'s first layer on vLLM {version}")
        if architecture == _DEEPSEEK_V32 and version >= Version(_DEEPSEEK_V32_OWN_MODEL):
            high = n - 1
            limits.append(f"id {n}, the final pre-norm state, is never captured by "
                          f"{architecture}'s DeepseekV32Model on vLLM {version} (CUDA, ROCm)")
        elif version < Version("0.25.0") and not final_id_repaired:
            high = n - 1
            limits.append(f"id {n}, the final pre-norm state, needs vLLM >= 0.25.0 for "
                          f"{architecture}")
    elif version < Version("0.18.0"):
        # 0.17's LlamaModel captures like DeepSeek before 0.25: before each layer only, and
        # before layer 0 adds a residual that is still None.
        if not first_id_repaired:
            low = 1
            limits.append(f"id 0 breaks the first layer on vLLM {version}")
        if not final_id_repaired:
            high = n - 1
            limits.append(f"id {n}, the final pre-norm state, needs vLLM >= 0.18.0")
    kimi = None if kimi_first_id_copied else first_id_limit(architecture, n, version, config)
    if kimi is not None:
        low = max(low, 1)
        limits.append(kimi)
    return ServableIds(low, high, tuple(limits))
