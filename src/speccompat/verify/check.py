"""The command: every file read, compared with what the directory records and with the
other files, and one report."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..layers import aux_slot_order
from .embeddings import Embeddings
from .layout import HIDDEN_STATES_SUBDIR, discover, find_gaps
from .metadata import DATA_CONFIG, model_hidden_size, read_metadata
from .readers import check_pt, check_safetensors, import_load_file, import_torch
from .report import Expected, FileResult, Format, Status, VerifyReport


def _majority(values: Iterable[Any]) -> Any:
    counted = Counter(v for v in values if v is not None)
    return counted.most_common(1)[0][0] if counted else None


def _first_id_reference(model: Path | None, layer_ids: Sequence[int] | None,
                        notes: list[str]) -> Embeddings | None:
    """The model's embeddings where id 0's slot can be checked against them; a note either
    way once id 0 is among the ids and a model is given."""
    if model is None or not layer_ids or 0 not in layer_ids:
        return None
    found = Embeddings.open(model)
    if isinstance(found, str):
        notes.append(f"id 0 not compared with the model's embeddings: {found}")
        return None
    notes.append(f"id 0 compared with {model}'s {found.name}, token by token")
    return found


def verify_dir(path: Path | str, *, model: Path | None = None,
               layer_ids: Sequence[int] | None = None) -> VerifyReport:
    """Check every hidden-state file under ``path``; see the package docstring.

    ``layer_ids``: the ids the server was asked for (any order, as given to vLLM), where the
    directory does not record them (speculators >= 0.5 writes no ``data_config.json``). With
    ``model`` and id 0 among them, id 0's slot is compared with the model's embeddings.

    Raises :class:`TorchMissingError` when torch cannot be imported; every
    problem with the files themselves is a verdict in the report, not an error.
    """
    torch = import_torch()
    directory = Path(path)
    if not directory.exists():
        return VerifyReport(directory, problems=(f"{directory} does not exist",))
    if not directory.is_dir():
        return VerifyReport(directory, problems=(f"{directory} is not a directory",))

    meta = read_metadata(directory)
    problems = list(meta.problems)
    notes = list(meta.notes)
    if layer_ids:
        given = tuple(layer_ids)
        if meta.layer_ids and tuple(aux_slot_order(meta.layer_ids)) != tuple(
                aux_slot_order(given)):
            notes.append(f"--layer-ids {list(given)} differ from {DATA_CONFIG}'s "
                         f"{list(meta.layer_ids)}: --layer-ids used")
        meta = dataclasses.replace(meta, layer_ids=given)
    counted = "len(hidden_states.layer_ids)"
    if meta.layer_ids:
        # Files hold each id once in layer order, whatever order the ids were given in.
        slots = tuple(aux_slot_order(meta.layer_ids))
        if slots != meta.layer_ids:
            notes.append(f"{DATA_CONFIG} lists layer_ids {list(meta.layer_ids)}; the files "
                         f"hold each id once in layer order: ids {list(slots)}")
            meta = dataclasses.replace(meta, layer_ids=slots)
            counted = "the distinct hidden_states.layer_ids"
    try:
        samples = discover(directory)
    except OSError as error:
        return VerifyReport(directory, problems=(f"cannot list {directory}: {error}",))
    if not samples:
        problems.append(f"no hidden-state files in {directory} (looked for data_{{i}}.pt, "
                        f"*.safetensors and {HIDDEN_STATES_SUBDIR}/*.safetensors)")

    load_file = None
    embeddings = None
    if any(s.format is Format.SAFETENSORS for s in samples):
        load_file = import_load_file()
        embeddings = _first_id_reference(model, meta.layer_ids, notes)
    observed = [check_pt(torch, s, meta) if s.format is Format.PT
                else check_safetensors(torch, load_file, s, meta.layer_ids, embeddings)
                for s in samples]

    # What every file must match: recorded facts first, else what most files agree on.
    if meta.layer_ids:
        layers, layers_from = len(meta.layer_ids), f"{counted} in {DATA_CONFIG}"
    else:
        layers, layers_from = _majority(o.layers for o in observed), "most files"
    hidden, hidden_from = None, ""
    if model is not None:
        try:
            hidden, hidden_from = model_hidden_size(model), f"--model {model}"
        except ValueError as error:
            problems.append(str(error))
        if hidden is not None and meta.hidden_size is not None and meta.hidden_size != hidden:
            notes.append(f"{DATA_CONFIG} records hidden_size {meta.hidden_size}, but --model "
                         f"says {hidden}: the data may come from another model")
    if hidden is None and meta.hidden_size is not None:
        hidden, hidden_from = meta.hidden_size, f"model.hidden_size in {DATA_CONFIG}"
    if hidden is None:
        hidden, hidden_from = _majority(o.hidden for o in observed), "most files"
    dtype = _majority(o.dtype for o in observed)
    expected = Expected(layers, layers_from, hidden, hidden_from, dtype,
                        "most files" if dtype is not None else "")

    results = []
    for seen in observed:
        reasons: list[str] = []  # what disagrees with the expectations first, then the rest
        if layers is not None and seen.layers is not None and seen.layers != layers:
            reasons.append(f"{seen.layers} layers, expected {layers} ({layers_from})")
        if hidden is not None and seen.hidden is not None and seen.hidden != hidden:
            reasons.append(f"hidden size {seen.hidden}, expected {hidden} ({hidden_from})")
        if dtype is not None and seen.dtype is not None and seen.dtype != dtype:
            reasons.append(f"dtype {seen.dtype}, but most files are {dtype}")
        reasons += seen.reasons
        sample = seen.sample
        results.append(FileResult(
            sample.name, sample.format, Status.FAIL if reasons else Status.OK, tuple(reasons),
            sample.index, seen.layers, seen.rows, seen.hidden, seen.dtype))

    gaps = find_gaps((s.name for s in samples), recorded=meta.sample_lengths)
    pt_count = sum(1 for s in samples if s.format is Format.PT)
    if meta.num_samples is not None and pt_count and meta.num_samples != pt_count:
        notes.append(f"{DATA_CONFIG} records num_samples {meta.num_samples}; "
                     f"{pt_count} data_{{i}}.pt files found")
    return VerifyReport(directory, tuple(results), gaps, tuple(problems), tuple(notes), expected)
