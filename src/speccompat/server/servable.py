"""The server path's layer ids: which ``eagle_aux_hidden_state_layer_ids`` one installed
vLLM serves for one model (the version boundaries read from the releases' model sources),
checked by ``adapters/extract_hidden_states_layer_ids.py`` at start-up. The conventions
themselves (old speculators ids vs vLLM aux ids) are the users', in ``speccompat.layers``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..layers import LayerIdError, _as_int, _num_layers, aux_slot_order

# Architectures whose decoder stack is vLLM's DeepseekV2Model (DeepSeek V2/V3, Kimi-K2.x).
_DEEPSEEK_FAMILY = ("Deepseek", "KimiK2")


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
                     final_id_repaired: bool = False) -> ServableIds:
    """Which ``eagle_aux_hidden_state_layer_ids`` vLLM's ``extract_hidden_states`` serves for
    ``architecture`` on ``vllm_version`` (id k = input of decoder layer k, id
    ``num_layers`` = the final pre-norm state), from the releases' model sources:

    - DeepSeek V2/V3 and Kimi-K2.x (``DeepseekV2Model``): id 0 adds a residual that does not
      exist yet before the first layer (TypeError, every release 0.18.0 to 0.33.0); id
      ``num_layers`` is captured only from 0.25.0 (vLLM PR #46973), before it the model
      returns one state fewer than asked and the request fails.
    - Every other architecture: 0..``num_layers``, except on 0.17.x, where the capture
      happens only before each layer (so ``num_layers`` never matches) and adds the
      residual that is still None before layer 0.

    ``first_id_repaired`` / ``final_id_repaired``: speccompat's adapters for this
    architecture (DeepSeek's ``deepseek_first_layer_residual`` and
    ``deepseek_final_layer_capture``; 0.17's ``llama_family_edge_ids``) are applied in the
    process that runs the model, so those ids are served after all.
    """
    from packaging.version import Version

    version = Version(Version(vllm_version).base_version)
    n = _num_layers(num_layers)
    limits: list[str] = []
    low, high = 0, n
    if architecture.startswith(_DEEPSEEK_FAMILY):
        if not first_id_repaired:
            low = 1
            limits.append(f"id 0 breaks {architecture}'s first layer on vLLM {version}")
        if version < Version("0.25.0") and not final_id_repaired:
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
    return ServableIds(low, high, tuple(limits))
