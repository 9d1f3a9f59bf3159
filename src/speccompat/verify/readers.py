"""Reading one file of each format and saying what it holds and what is wrong with it.

torch and safetensors are imported when a directory is checked, never at import time.
"""

from __future__ import annotations

import importlib
import re
import zipfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpeccompatError
from .embeddings import Embeddings
from .metadata import SAMPLE_LENGTHS, Metadata, is_int
from .report import SampleFile

SEED_BUG_ADAPTER = "vllm.collective_rpc_unique_reply_rank"


class TorchMissingError(SpeccompatError):
    """``verify`` needs torch to read the files, and torch cannot be imported."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            "`speccompat verify` needs torch to read hidden-state files, and torch cannot "
            f"be imported in this Python ({detail}). Run it with the Python environment "
            "that generated or trains on the data, or install torch."
        )

@dataclass
class _Observed:
    """What one file holds, before it is compared with the other files."""

    sample: SampleFile
    reasons: list[str] = field(default_factory=list)
    layers: int | None = None
    rows: int | None = None
    hidden: int | None = None
    dtype: str | None = None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text and text[0] else type(error).__name__


def _damage(path: Path) -> str:
    """A guess at what is wrong with a file torch could not read."""
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            head = stream.read(4)
    except OSError:
        return "truncated or corrupt"
    if size == 0:
        return "empty file"
    if head == b"PK\x03\x04" and not zipfile.is_zipfile(path):
        return f"truncated: a zip archive without its central directory, {size} bytes"
    return f"truncated or corrupt, {size} bytes"


def _weights_only_refusal(error: BaseException) -> str | None:
    text = str(error)
    if "weights only load failed" not in text.lower() and "weights_only" not in text:
        return None
    match = re.search(r"(Unsupported global: GLOBAL \S+|Unsupported operand[^.\n]*)", text)
    what = match.group(1) if match else _first_line(error)
    return ("refused: not loadable with torch.load(weights_only=True) "
            f"({what}); it was not unpickled, because that could run arbitrary code")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(tensor: Any) -> list[int]:
    return [int(d) for d in tensor.shape]


def _length(torch: Any, value: Any) -> int | None:
    """The length of a 1-D tensor or a list of ints; ``None`` for anything else."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() == 1 else None
    if isinstance(value, (list, tuple)) and all(is_int(v) for v in value):
        return len(value)
    return None


def _some(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:4])
    return shown + (f", ... ({len(indices)} in all)" if len(indices) > 4 else "")


def _slots(indices: Sequence[int], layer_ids: Sequence[int] | None, count: int) -> str:
    """Slot numbers as a file holds them, with the layer id of each where recorded:
    "slots 1, 3 (ids 2, 4)". A slot is a position in the file, not a layer number."""
    text = f"slot{'s' if len(indices) > 1 else ''} {_some(indices)}"
    if layer_ids is not None and len(layer_ids) == count:
        ids = [layer_ids[i] for i in indices]
        text += f" (id{'s' if len(ids) > 1 else ''} {_some(ids)})"
    return text


def _nonfinite(torch: Any, tensor: Any) -> int:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    return int((~torch.isfinite(tensor)).sum().item())


def check_pt(torch: Any, sample: SampleFile, meta: Metadata) -> _Observed:
    seen = _Observed(sample)
    try:
        data = torch.load(sample.path, weights_only=True, map_location="cpu")
    except Exception as error:  # a truncated or corrupt file is a verdict, not a crash
        refusal = _weights_only_refusal(error)
        seen.reasons.append(refusal or f"unreadable ({_damage(sample.path)}): "
                            f"{_first_line(error)}")
        return seen
    if not isinstance(data, Mapping):
        seen.reasons.append(f"holds a {type(data).__name__}, expected a dict with input_ids, "
                            "hidden_states and loss_mask")
        return seen
    missing = [k for k in ("input_ids", "hidden_states") if k not in data]
    if missing:
        seen.reasons.append(f"no {' or '.join(missing)} (keys: {sorted(map(str, data))})")
        return seen

    rows = _length(torch, data["input_ids"])
    if rows is None:
        seen.reasons.append("input_ids is not a 1-D tensor of token ids")
    else:
        seen.rows = rows
        recorded = meta.sample_lengths.get(sample.index) if sample.index is not None else None
        if recorded is not None and recorded != rows:
            seen.reasons.append(f"{rows} input_ids, but {SAMPLE_LENGTHS} records {recorded}")
        ids = data["input_ids"]
        if isinstance(ids, torch.Tensor) and ids.is_floating_point():
            seen.reasons.append(f"input_ids in {_dtype_name(ids.dtype)}, expected integers")

    states = data["hidden_states"]
    if isinstance(states, torch.Tensor):
        seen.reasons.append(f"hidden_states is one tensor of shape {_shape(states)}, "
                            "expected a list with one [rows, hidden] tensor per layer")
        return seen
    if not isinstance(states, (list, tuple)):
        seen.reasons.append(f"hidden_states is a {type(states).__name__}, expected a list "
                            "of tensors")
        return seen
    seen.layers = len(states)
    not_tensors = [i for i, t in enumerate(states) if not isinstance(t, torch.Tensor)]
    if not_tensors:
        seen.reasons.append(f"hidden_states items {_some(not_tensors)} are not tensors")
        return seen
    if not states:
        seen.reasons.append("hidden_states is empty")
        return seen

    flat = [i for i, t in enumerate(states) if t.dim() != 2]
    if flat:
        shapes = Counter(str(_shape(states[i])) for i in flat)
        common = ", ".join(f"{n} x {s}" for s, n in shapes.most_common(3))
        which = ("no item is" if len(flat) == len(states)
                 else f"items {_some(flat)} are not")
        reason = f"hidden_states: {which} 2-D [rows, hidden] (found {common})"
        if len(flat) == len(states) and all(t.dim() == 1 for t in states):
            reason += (": 1-D items are the signature of vLLM >= 0.11.1's "
                       "collective_rpc(unique_reply_rank=0) returning rank 0's reply bare, "
                       "which speculators 0.3.0 then indexed with [0]; regenerate with "
                       f"speccompat applied (adapter {SEED_BUG_ADAPTER})")
        seen.reasons.append(reason)
    matrices = [t for t in states if t.dim() == 2]
    if matrices:
        widths = Counter(int(t.shape[1]) for t in matrices)
        seen.hidden = widths.most_common(1)[0][0]
        if len(widths) > 1:
            seen.reasons.append(f"layers differ in width: {dict(widths)}")
        if rows is not None:
            off = [i for i, t in enumerate(states) if t.dim() == 2 and int(t.shape[0]) != rows]
            if off:
                verb = "have" if len(off) > 1 else "has"
                seen.reasons.append(f"{_slots(off, meta.layer_ids, len(states))} {verb} "
                                    f"{int(states[off[0]].shape[0])} "
                                    f"rows, but input_ids has {rows}")
    dtypes = Counter(_dtype_name(t.dtype) for t in states)
    seen.dtype = dtypes.most_common(1)[0][0]
    if len(dtypes) > 1:
        seen.reasons.append(f"layers differ in dtype: {dict(dtypes)}")
    if matrices and len(matrices) == len(states) and all(t.is_floating_point() for t in states):
        seen.reasons.extend(_copied_slots(torch, states, meta.layer_ids, server_ids=False))
    bad = [(i, n) for i, t in enumerate(states) if (n := _nonfinite(torch, t))]
    if bad:
        where = _slots([i for i, _ in bad], meta.layer_ids, len(states))
        seen.reasons.append(f"non-finite values (NaN/inf) in {where}"
                            f" ({sum(n for _, n in bad)} values)")

    if "loss_mask" in data and data["loss_mask"] is not None:
        length = _length(torch, data["loss_mask"])
        if length is None:
            seen.reasons.append("loss_mask is not a 1-D tensor")
        elif rows is not None and length != rows:
            seen.reasons.append(f"loss_mask has {length} entries, but input_ids has {rows}")
    return seen


def check_safetensors(torch: Any, load_file: Any, sample: SampleFile,
                      layer_ids: Sequence[int] | None = None,
                      embeddings: Embeddings | None = None) -> _Observed:
    """One ``.safetensors`` file; ``embeddings``: the model's rows to compare id 0 with,
    where ``layer_ids`` hold id 0 (its slot is the first: slots follow layer order)."""
    seen = _Observed(sample)
    if load_file is None:
        seen.reasons.append("this format needs the safetensors package, which is not "
                            "importable here (pip install safetensors)")
        return seen
    try:
        data = load_file(str(sample.path), device="cpu")
    except Exception as error:  # a truncated or corrupt file is a verdict, not a crash
        seen.reasons.append(f"unreadable (truncated or corrupt): {_first_line(error)}")
        return seen
    missing = [k for k in ("hidden_states", "token_ids") if k not in data]
    if missing:
        seen.reasons.append(f"no {' or '.join(missing)} (keys: {sorted(data)})")
        return seen
    states, ids = data["hidden_states"], data["token_ids"]
    rows = _length(torch, ids)
    if rows is None:
        seen.reasons.append(f"token_ids of shape {_shape(ids)}, expected 1-D [num_tokens]")
    else:
        seen.rows = rows
    seen.dtype = _dtype_name(states.dtype)
    if states.dim() != 3:
        seen.reasons.append(f"hidden_states of shape {_shape(states)}, expected 3-D "
                            "[num_tokens, num_layers, hidden]")
        return seen
    tokens, seen.layers, seen.hidden = (int(d) for d in states.shape)
    if rows is not None and tokens != rows:
        seen.reasons.append(f"hidden_states has {tokens} tokens, but token_ids has {rows}")
    if states.is_floating_point():
        per_layer = (~torch.isfinite(states)).sum(dim=(0, 2))
        bad = [i for i, n in enumerate(per_layer.tolist()) if n]
        if bad:
            seen.reasons.append(f"non-finite values (NaN/inf) in "
                                f"{_slots(bad, layer_ids, seen.layers)} "
                                f"({int(per_layer.sum().item())} values)")
        seen.reasons.extend(_zero_rows(states, layer_ids) + _copied_slots(
            torch, [states[:, i] for i in range(seen.layers)], layer_ids))
        if (embeddings is not None and layer_ids and layer_ids[0] == 0 and rows == tokens
                and len(layer_ids) == seen.layers):
            mismatch = embeddings.mismatch(torch, ids, states[:, 0])
            if mismatch:
                seen.reasons.append(mismatch)
    mask = data.get("loss_mask")
    if mask is not None:
        length = _length(torch, mask)
        if length is None or (rows is not None and length != rows):
            seen.reasons.append(f"loss_mask of shape {_shape(mask)}, but token_ids has {rows}")
    return seen


def _zero_rows(states: Any, layer_ids: Sequence[int] | None = None) -> list[str]:
    """Tokens whose state is exactly zero in a layer: no real token's hidden state is, so
    they are rows nobody wrote (vLLM 0.22-0.24's connector on hybrid models)."""
    zero = (states == 0).all(dim=2)  # [tokens, layers]
    per_layer = zero.sum(dim=0).tolist()
    tokens, layers = int(states.shape[0]), int(states.shape[1])
    found = [f"{_slots([i], layer_ids, layers)}: {n} of {tokens}"
             f"{' (the whole slot)' if n == tokens else ''}" for i, n in enumerate(per_layer) if n]
    if not found:
        return []
    rows = int(zero.any(dim=1).sum())
    return [f"all-zero rows (tokens whose state is exactly 0) in {'; '.join(found)} "
            f"({rows} of {tokens} tokens, {len(found)} of {layers} slots): "
            "states nobody wrote, not a model's output"]


def _copied_slots(torch: Any, slots: Sequence[Any], layer_ids: Sequence[int] | None = None,
                  *, server_ids: bool = True) -> list[str]:
    """Two layer slots equal for every token. Where one of them is id 0's (the server's id
    0, the embeddings: by the recorded ids, or slot 0 where none are recorded), the
    eager-mode aliasing of vLLM >= 0.18's EagleModelMixin on CUDA wrote a later state
    there. Otherwise vLLM filled the slot of an id its model cannot serve with another
    id's state (ids beyond num_hidden_layers on vLLM 0.26). ``server_ids=False``: the old
    generator's ids (id k = the output of layer k), where no slot is the embeddings."""
    count = len(slots)
    pairs = [(i, j) for i in range(count) for j in range(i + 1, count)
             if slots[i].shape == slots[j].shape and torch.equal(slots[i], slots[j])
             and bool(slots[i].any())]
    if not pairs:
        return []
    recorded = layer_ids is not None and len(layer_ids) == count
    named = ([f"{i} (id {layer_ids[i]})" for i in range(count)] if layer_ids and recorded
             else [str(i) for i in range(count)])
    embeddings: int | None = None
    if server_ids:
        embeddings = (0 if not recorded else
                      list(layer_ids or ()).index(0) if 0 in (layer_ids or ()) else None)
    reasons = []
    aliased = [j for i, j in pairs if i == embeddings]
    if embeddings is not None and aliased:
        where = "" if recorded else " (where slot 0 is id 0)"
        reasons.append(
            f"layer slot {named[embeddings]}, the embeddings{where}, holds the same states "
            f"as slot{'s' if len(aliased) > 1 else ''} {', '.join(named[j] for j in aliased)} "
            "for every token: an --enforce-eager CUDA server of vLLM >= 0.18 overwrites id 0 "
            "in place with a later layer's state; regenerate with speccompat installed in "
            "the server's environment (adapter vllm.eagle_mixin_capture_alias)")
    rest = [(i, j) for i, j in pairs if i != embeddings]
    if rest:
        listed = ", ".join(f"{named[i]} and {named[j]}" for i, j in rest)
        reasons.append(
            f"layer slots {listed} hold identical states for every token: one of each pair "
            "is most likely a layer id the model could not serve (vLLM copies another id's "
            "state there; speccompat's vllm.extract_hidden_states_layer_ids refuses such ids)")
    return reasons


def import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except (ImportError, OSError) as error:
        raise TorchMissingError(_first_line(error)) from error


def import_load_file() -> Any:
    try:
        return importlib.import_module("safetensors.torch").load_file
    except (ImportError, OSError, AttributeError):
        return None
