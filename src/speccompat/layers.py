"""Layer-id semantics: old speculators ids vs vLLM's ``eagle_aux_hidden_state_layer_ids``.

Both systems capture the pre-final-norm residual stream (``hidden_states + residual``),
but they count differently. For a model with ``N`` decoder layers:

- ``LayerIdConvention.LAYER_OUTPUT`` (speculators 0.3 / 0.4,
  ``VllmHiddenStatesGenerator(layer_ids=...)``): id ``k`` is the *output* of decoder
  layer ``k``. Valid ids ``0 .. N-1``; default ``[2, N//2, N-3, N-1]``.
- ``LayerIdConvention.LAYER_INPUT`` (vLLM ``eagle_aux_hidden_state_layer_ids``, used by
  speculators >= 0.5 through ``extract_hidden_states``): id ``k`` is the *input* of decoder
  layer ``k``, and id ``N`` the state after the last layer, before the final norm. Valid
  ids ``0 .. N``; default (speculators' ``launch_vllm.py``) ``[2, N//2, N-3, N]``.

So old id ``k`` is vLLM aux id ``k + 1``: to reproduce an old dataset with vLLM aux ids,
convert with :func:`to_vllm_aux_ids` (Kimi-K2.5, N=61: ``[2, 30, 58, 60]`` -> ``[3, 31, 59,
61]``). The new default ``[2, 30, 58, 61]`` is *not* the old data: only the last id agrees.
Aux id 0 (the token embeddings) has no old-speculators equivalent.

HF transformers' ``output_hidden_states`` has ``N + 1`` entries: entry 0 is the embeddings
(the input of layer 0), entry ``i`` for ``1 <= i < N`` is the output of layer ``i - 1``,
but entry ``N`` has the model's final norm applied. The final pre-norm state (old id
``N - 1`` = aux id ``N``) is therefore in *no* entry of ``output_hidden_states``; take it
with a forward hook on the last decoder layer, or a forward pre-hook on the final norm.
See :func:`hf_hidden_states_index`.

Both systems capture one tensor per distinct id in ascending layer order, whatever the
order of the list given: speculators 0.3.0's worker turns the ids into a ``frozenset``, and
vLLM (0.16's Llama loop, 0.18+'s ``_maybe_add_hidden_state``) tests
``idx in aux_hidden_state_layers`` while walking the layers; from 0.30 the model stores
``tuple(sorted(set(ids)))`` itself. :func:`aux_slot_order` gives the slot order a file
holds; speccompat's server path writes that order into the engine's config, so every
release and runner writes and counts the same slots.

A dataset records which convention produced it in ``speccompat_layers.json``
(:class:`LayerIdRecord`), so a reader never has to guess.
"""

from __future__ import annotations

import enum
import json
import operator
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SpeccompatError

__all__ = [
    "RECORD_FILENAME",
    "LayerIdConvention",
    "LayerIdError",
    "LayerIdRecord",
    "aux_slot_order",
    "default_layer_ids",
    "hf_hidden_states_index",
    "to_speculators_ids",
    "to_vllm_aux_ids",
]

#: Name of the record written next to a dataset by :meth:`LayerIdRecord.write`.
RECORD_FILENAME = "speccompat_layers.json"
#: Version of the record's JSON layout; :meth:`LayerIdRecord.from_json` refuses others.
RECORD_FORMAT = 1


class LayerIdConvention(str, enum.Enum):
    """What a layer id counts."""

    #: Old speculators (0.3 / 0.4): id k = output of decoder layer k = HF hidden_states[k + 1].
    LAYER_OUTPUT = "speculators-output"
    #: vLLM ``eagle_aux_hidden_state_layer_ids``: id k = input of decoder layer k
    #: = HF hidden_states[k]; id N = after the last layer, before the final norm.
    LAYER_INPUT = "vllm-aux-input"

    def __str__(self) -> str:
        return self.value


class LayerIdError(ValueError, SpeccompatError):
    """A layer id, layer count or layer-id record is out of range or malformed."""

    def __init__(self, found: str, valid: str, advice: str) -> None:
        self.found = found
        self.valid = valid
        self.advice = advice
        super().__init__(f"{found}; valid: {valid}. {advice}")


_MEANING = {
    LayerIdConvention.LAYER_OUTPUT: "id k = output of decoder layer k (HF hidden_states[k + 1])",
    LayerIdConvention.LAYER_INPUT: (
        "id k = input of decoder layer k (HF hidden_states[k]); "
        "id num_layers = after the last layer, before the final norm"
    ),
}
_NAME = {
    LayerIdConvention.LAYER_OUTPUT: "old speculators layer id",
    LayerIdConvention.LAYER_INPUT: "vLLM aux layer id",
}


def _convention(value: LayerIdConvention | str) -> LayerIdConvention:
    try:
        return LayerIdConvention(value)
    except ValueError:
        valid = ", ".join(repr(c.value) for c in LayerIdConvention)
        raise LayerIdError(
            f"unknown layer-id convention {value!r}",
            valid,
            "Use LayerIdConvention.LAYER_OUTPUT for old speculators (0.3/0.4) ids and "
            "LayerIdConvention.LAYER_INPUT for vLLM eagle_aux_hidden_state_layer_ids.",
        ) from None


def _as_int(value: object, what: str) -> int:
    """``value`` as an ``int`` (anything with ``__index__``, e.g. numpy ints; not bool)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise LayerIdError(
        f"{what} {value!r} is a {type(value).__name__}",
        "an integer",
        "Pass integer layer ids and layer counts.",
    )


def _num_layers(num_layers: object) -> int:
    count = _as_int(num_layers, "num_layers")
    if count < 1:
        raise LayerIdError(
            f"num_layers {count}",
            "1 or more",
            "Pass the target model's number of decoder layers (config.num_hidden_layers, "
            "or config.text_config.num_hidden_layers for a multimodal model).",
        )
    return count


def _max_id(convention: LayerIdConvention, num_layers: int) -> int:
    return num_layers - 1 if convention is LayerIdConvention.LAYER_OUTPUT else num_layers


def _check_ids(
    ids: Iterable[object], num_layers: int, convention: LayerIdConvention
) -> list[int]:
    top = _max_id(convention, num_layers)
    checked: list[int] = []
    for position, raw in enumerate(ids):
        layer_id = _as_int(raw, f"{_NAME[convention]} at position {position}")
        if 0 <= layer_id <= top:
            checked.append(layer_id)
            continue
        found = (f"{_NAME[convention]} {layer_id} (position {position}) is out of range "
                 f"for a model with {num_layers} decoder layers")
        valid = f"0..{top} ({_MEANING[convention]})"
        if convention is LayerIdConvention.LAYER_OUTPUT and layer_id == num_layers:
            advice = (f"Id {num_layers} looks like a vLLM aux id (the final pre-norm state); "
                      f"its old speculators id is {num_layers - 1}. If these ids are vLLM aux "
                      "ids, use to_speculators_ids / LayerIdConvention.LAYER_INPUT.")
        else:
            advice = ("Check num_layers (config.num_hidden_layers, or "
                      "text_config.num_hidden_layers) and which convention the ids follow.")
        raise LayerIdError(found, valid, advice)
    return checked


def aux_slot_order(ids: Iterable[object]) -> list[int]:
    """The layer id in each slot of a file extracted with ``ids``: each distinct id once, in
    ascending layer order (``[5, 2, 10, 2]`` -> ``[2, 5, 10]``), as vLLM >= 0.30 stores the
    aux layers (``tuple(sorted(set(layers)))``) and every model walks its layers."""
    return sorted({_as_int(raw, f"layer id at position {at}") for at, raw in enumerate(ids)})


def to_vllm_aux_ids(output_ids: Iterable[int], num_layers: int) -> list[int]:
    """Old speculators ids (output of layer k) -> vLLM aux ids (input of layer k + 1).

    Order and duplicates are kept. Raises :class:`LayerIdError` for an id outside
    ``0 .. num_layers - 1``.
    """
    count = _num_layers(num_layers)
    return [k + 1 for k in _check_ids(output_ids, count, LayerIdConvention.LAYER_OUTPUT)]


def to_speculators_ids(aux_ids: Iterable[int], num_layers: int) -> list[int]:
    """vLLM aux ids (input of layer k) -> old speculators ids (output of layer k - 1).

    Order and duplicates are kept. Raises :class:`LayerIdError` for an id outside
    ``0 .. num_layers``, and for aux id 0 (the token embeddings, which old speculators
    never captures).
    """
    count = _num_layers(num_layers)
    ids = _check_ids(aux_ids, count, LayerIdConvention.LAYER_INPUT)
    if 0 in ids:
        raise LayerIdError(
            f"vLLM aux layer id 0 (position {ids.index(0)}) is the input of decoder layer 0, "
            "i.e. the token embeddings, which old speculators cannot capture",
            f"1..{count} (old speculators ids 0..{count - 1})",
            "Drop id 0, or extract with vLLM aux ids (speculators >= 0.5) instead.",
        )
    return [k - 1 for k in ids]


def default_layer_ids(num_layers: int, convention: LayerIdConvention) -> list[int]:
    """The ids each system picks when none are given, exactly as upstream computes them.

    ``LAYER_OUTPUT``: speculators 0.3/0.4 ``VllmHiddenStatesGenerator``,
    ``[2, N//2, N-3, N-1]``. ``LAYER_INPUT``: speculators >= 0.5 ``launch_vllm.py``,
    ``[2, N//2, N-3, N]`` (vLLM's own model default, used without speculators, is
    ``(2, N//2, N-3)``). The two defaults select different layers except for the last
    one; ``to_vllm_aux_ids(default_layer_ids(N, LAYER_OUTPUT), N)`` reproduces old data.

    For small models the list may repeat an id (N=4: ``[2, 2, 1, 3]``); both systems then
    store that layer once. Models with fewer than 3 layers have no default.
    """
    count = _num_layers(num_layers)
    conv = _convention(convention)
    last = count - 1 if conv is LayerIdConvention.LAYER_OUTPUT else count
    ids = [2, count // 2, count - 3, last]
    if count < 3:
        raise LayerIdError(
            f"no default {_NAME[conv]}s for a model with {count} decoder layers "
            f"(the upstream formula gives {ids})",
            "num_layers >= 3",
            "Pass the layer ids explicitly.",
        )
    return ids


def hf_hidden_states_index(
    layer_id: int, convention: LayerIdConvention, *, num_layers: int | None = None
) -> int:
    """Which entry of HF ``output_hidden_states`` equals the state ``layer_id`` names.

    ``LAYER_OUTPUT`` id k -> ``k + 1``; ``LAYER_INPUT`` id k -> ``k``.

    Caveat: HF's last entry (index ``num_layers``) has the final norm applied, so it is
    *not* the final pre-norm state (old id ``N - 1``, aux id ``N``) that both systems
    capture; no HF entry is. Without ``num_layers`` the index is returned anyway (it is
    exact for every other id). With ``num_layers`` the id is range-checked and the final
    id raises :class:`LayerIdError`: take that state with a forward hook on the last
    decoder layer or a forward pre-hook on the final norm.
    """
    conv = _convention(convention)
    value = _as_int(layer_id, _NAME[conv])
    if value < 0:
        raise LayerIdError(f"{_NAME[conv]} {value}", "0 or more", "Layer ids count from 0.")
    index = value + 1 if conv is LayerIdConvention.LAYER_OUTPUT else value
    if num_layers is not None:
        count = _num_layers(num_layers)
        _check_ids([value], count, conv)
        if index == count:
            raise LayerIdError(
                f"{_NAME[conv]} {value} is the final pre-norm state of a {count}-layer "
                f"model, but HF output_hidden_states[{count}] has the final norm applied",
                f"ids whose HF index is 0..{count - 1}",
                "Capture it with a forward hook on model.model.layers[-1] (output[0] if a "
                "tuple) or a forward pre-hook on model.model.norm.",
            )
    return index


@dataclass(frozen=True)
class LayerIdRecord:
    """Which layer ids, in which convention, produced a dataset.

    Stored as ``speccompat_layers.json`` next to the dataset (:meth:`write` / :meth:`read`).
    ``layer_ids`` are kept in the order given (a tuple); the ids are range-checked.
    """

    convention: LayerIdConvention
    layer_ids: Sequence[int]
    num_layers: int

    def __post_init__(self) -> None:
        conv = _convention(self.convention)
        count = _num_layers(self.num_layers)
        ids = tuple(_check_ids(self.layer_ids, count, conv))
        object.__setattr__(self, "convention", conv)
        object.__setattr__(self, "num_layers", count)
        object.__setattr__(self, "layer_ids", ids)

    def as_convention(self, convention: LayerIdConvention) -> LayerIdRecord:
        """The same layers, counted in ``convention`` (raises for aux id 0 -> old ids)."""
        conv = _convention(convention)
        if conv is self.convention:
            return self
        if conv is LayerIdConvention.LAYER_INPUT:
            ids = to_vllm_aux_ids(self.layer_ids, self.num_layers)
        else:
            ids = to_speculators_ids(self.layer_ids, self.num_layers)
        return LayerIdRecord(conv, ids, self.num_layers)

    def to_json(self) -> str:
        """The record as JSON text (``meaning`` is for humans and ignored on reading)."""
        data = {
            "format": RECORD_FORMAT,
            "convention": self.convention.value,
            "meaning": _MEANING[self.convention],
            "layer_ids": list(self.layer_ids),
            "num_layers": self.num_layers,
        }
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> LayerIdRecord:
        """Parse :meth:`to_json` output; malformed records raise :class:`LayerIdError`."""
        fix = f"Rewrite it with LayerIdRecord(...).write(dataset_dir) ({RECORD_FILENAME})."
        try:
            data: Any = json.loads(text)
        except ValueError as exc:
            raise LayerIdError(f"a layer-id record that is not JSON ({exc})",
                               "a JSON object", fix) from exc
        if not isinstance(data, dict):
            raise LayerIdError(f"a layer-id record that is a JSON {type(data).__name__}",
                               "a JSON object", fix)
        missing = [k for k in ("format", "convention", "layer_ids", "num_layers")
                   if k not in data]
        if missing:
            raise LayerIdError(f"a layer-id record without {', '.join(missing)}",
                               "keys format, convention, layer_ids, num_layers", fix)
        if data["format"] != RECORD_FORMAT or isinstance(data["format"], bool):
            raise LayerIdError(
                f"layer-id record format {data['format']!r}", f"format {RECORD_FORMAT}",
                "It was written by another speccompat version; read it with that version "
                "or upgrade speccompat.")
        if not isinstance(data["layer_ids"], list):
            raise LayerIdError(
                f"layer_ids {data['layer_ids']!r} in a layer-id record",
                "a JSON list of integers", fix)
        return cls(_convention(data["convention"]), data["layer_ids"], data["num_layers"])

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``speccompat_layers.json`` into ``directory`` (atomically); return its path."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / RECORD_FILENAME
        tmp = folder / f".{RECORD_FILENAME}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_text(self.to_json() + "\n", encoding="utf-8")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> LayerIdRecord:
        """Read the record of the dataset in ``directory`` (or the record file itself)."""
        path = Path(directory)
        if path.is_dir():
            path = path / RECORD_FILENAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise LayerIdError(
                f"no layer-id record at {path}",
                f"a {RECORD_FILENAME} written by LayerIdRecord.write",
                "The dataset does not say which layer-id convention produced it. Old "
                "speculators (0.3/0.4) data uses LayerIdConvention.LAYER_OUTPUT, data from "
                "vLLM extract_hidden_states (speculators >= 0.5) LAYER_INPUT; write the "
                "record once you know.",
            ) from None
        return cls.from_json(text)
