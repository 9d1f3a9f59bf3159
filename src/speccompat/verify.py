"""``python -m speccompat verify DIR``: check hidden-state extraction outputs on disk.

Two layouts are understood:

* speculators 0.3/0.4 offline data generation: ``DIR/data_{i}.pt``, each a
  ``torch.save`` of ``{"input_ids": [seq_len], "hidden_states": [[seq_len, hidden]
  per layer], "loss_mask": [seq_len] or None}``, with an optional
  ``DIR/data_config.json`` (speculators' ``DataGenerationConfig``);
* speculators >= 0.5 / vLLM's ``ExampleHiddenStatesConnector``:
  ``DIR/hs_{i}.safetensors`` or ``*.safetensors`` in ``DIR`` or
  ``DIR/hidden_states/``, each holding ``hidden_states`` ``[num_tokens, num_layers,
  hidden]`` and ``token_ids`` ``[num_tokens]``.

``.pt`` files are read with ``torch.load(..., weights_only=True)`` and nothing
else: a file that needs more than tensors and plain containers is reported, never
unpickled. This module imports neither torch nor safetensors at import time.
"""

from __future__ import annotations

import enum
import importlib
import json
import re
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpeccompatError

DATA_CONFIG = "data_config.json"
SAMPLE_LENGTHS = "sample_lengths.json"
HIDDEN_STATES_SUBDIR = "hidden_states"
SEED_BUG_ADAPTER = "vllm.collective_rpc.unique_reply_rank"

_INDEXED = re.compile(r"^(?P<stem>data_|hs_)(?P<index>\d+)(?P<ext>\.pt|\.safetensors)$")


class TorchMissingError(SpeccompatError):
    """``verify`` needs torch to read the files, and torch cannot be imported."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            "`speccompat verify` needs torch to read hidden-state files, and torch cannot "
            f"be imported in this Python ({detail}). Run it with the Python environment "
            "that generated or trains on the data, or install torch."
        )


class Format(str, enum.Enum):
    """The on-disk layout a file belongs to."""

    PT = "pt"  # speculators 0.3/0.4: data_{i}.pt
    SAFETENSORS = "safetensors"  # speculators >= 0.5 / vLLM ExampleHiddenStatesConnector


class Status(str, enum.Enum):
    OK = "ok"
    FAIL = "fail"


@dataclass(frozen=True)
class SampleFile:
    """One file to check; ``name`` is relative to the directory checked."""

    path: Path
    name: str
    format: Format
    index: int | None


@dataclass(frozen=True)
class FileResult:
    """The verdict on one file and what was observed in it."""

    name: str
    format: Format
    status: Status
    reasons: tuple[str, ...] = ()
    index: int | None = None
    layers: int | None = None
    rows: int | None = None
    hidden: int | None = None
    dtype: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.name, "format": self.format.value, "index": self.index,
            "status": self.status.value, "ok": self.ok, "reasons": list(self.reasons),
            "layers": self.layers, "rows": self.rows, "hidden": self.hidden, "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Gap:
    """Indices missing from one numbered sequence of files (``pattern`` has ``{i}``)."""

    pattern: str
    indices: tuple[int, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.pattern.format(i=i) for i in self.indices)

    def describe(self) -> str:
        ranges = []
        for first, last in _ranges(self.indices):
            if first == last:
                ranges.append(self.pattern.format(i=first))
            else:
                ranges.append(f"{self.pattern.format(i=first)} .. {self.pattern.format(i=last)}")
        count = len(self.indices)
        noun = "index" if count == 1 else "indices"
        return f"{count} {noun} missing from {self.pattern}: {', '.join(ranges)}"

    def as_dict(self) -> dict[str, object]:
        return {"pattern": self.pattern, "indices": list(self.indices), "files": list(self.files)}


@dataclass(frozen=True)
class Expected:
    """What every file must match, and where each expectation came from."""

    layers: int | None = None
    layers_from: str = ""
    hidden: int | None = None
    hidden_from: str = ""
    dtype: str | None = None
    dtype_from: str = ""

    def describe(self) -> str:
        def one(what: str, value: object, source: str) -> str:
            return f"{what} {value} ({source})" if value is not None else f"{what} unknown"

        return ", ".join([one("layers", self.layers, self.layers_from),
                          one("hidden", self.hidden, self.hidden_from),
                          one("dtype", self.dtype, self.dtype_from)])

    def as_dict(self) -> dict[str, object]:
        return {"layers": self.layers, "layers_from": self.layers_from or None,
                "hidden": self.hidden, "hidden_from": self.hidden_from or None,
                "dtype": self.dtype, "dtype_from": self.dtype_from or None}


@dataclass(frozen=True)
class VerifyReport:
    """Per-file verdicts for one directory, plus what is wrong with the directory itself."""

    directory: Path
    files: tuple[FileResult, ...] = ()
    gaps: tuple[Gap, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    expected: Expected = field(default_factory=Expected)

    @property
    def missing(self) -> int:
        return sum(len(g.indices) for g in self.gaps)

    @property
    def passed(self) -> int:
        return sum(1 for f in self.files if f.ok)

    @property
    def failed(self) -> int:
        return len(self.files) - self.passed

    @property
    def ok(self) -> bool:
        return bool(self.files) and not self.failed and not self.gaps and not self.problems

    def totals(self) -> dict[str, int]:
        return {"files": len(self.files), "ok": self.passed, "failed": self.failed,
                "missing": self.missing}

    def as_dict(self) -> dict[str, object]:
        return {
            "directory": str(self.directory),
            "ok": self.ok,
            "totals": self.totals(),
            "expected": self.expected.as_dict(),
            "files": [f.as_dict() for f in self.files],
            "missing": [g.as_dict() for g in self.gaps],
            "problems": list(self.problems),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def render(self) -> str:
        """A table, one line per file, then the missing files, problems and totals."""
        lines = [f"speccompat verify {self.directory}"]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  expected: {self.expected.describe()}")
        if self.files:
            header = ("file", "status", "layers", "rows", "hidden", "dtype", "reason")
            rows = [(f.name, f.status.value.upper() if not f.ok else f.status.value,
                     _cell(f.layers), _cell(f.rows), _cell(f.hidden), _cell(f.dtype),
                     "; ".join(f.reasons)) for f in self.files]
            widths = [max(len(r[i]) for r in [header, *rows]) for i in range(6)]
            for row in [header, *rows]:
                cells = [row[i].ljust(widths[i]) for i in range(6)]
                lines.append(("  ".join([*cells, row[6]])).rstrip())
        lines += [f"MISSING: {g.describe()}" for g in self.gaps]
        lines += [f"PROBLEM: {p}" for p in self.problems]
        t = self.totals()
        verdict = "OK" if self.ok else "NOT OK"
        lines.append(f"total: {t['files']} files, {t['ok']} ok, {t['failed']} failed, "
                     f"{t['missing']} missing: {verdict}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _ranges(indices: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


# --------------------------------------------------------------------------- pure logic


def index_of(name: str) -> tuple[str, int] | None:
    """``("hidden_states/hs_{i}.safetensors", 3)`` for ``hidden_states/hs_3.safetensors``."""
    folder, _, base = name.rpartition("/")
    match = _INDEXED.match(base)
    if match is None:
        return None
    pattern = f"{match['stem']}{{i}}{match['ext']}"
    return (f"{folder}/{pattern}" if folder else pattern), int(match["index"])


def find_gaps(names: Iterable[str], *, recorded: Iterable[int] = ()) -> tuple[Gap, ...]:
    """Indices missing from each numbered sequence (``data_{i}.pt``, ``hs_{i}.safetensors``).

    Sequences start at 0 (speculators numbers its files from 0 and resumes after
    the highest index present). ``recorded`` are indices of ``data_{i}.pt`` that
    speculators' ``sample_lengths.json`` says were written.
    """
    present: dict[str, set[int]] = {}
    for name in names:
        found = index_of(name)
        if found is not None:
            present.setdefault(found[0], set()).add(found[1])
    written = set(recorded)
    if written:
        present.setdefault("data_{i}.pt", set())
    gaps = []
    for pattern, indices in sorted(present.items()):
        wanted = set(range(max(indices) + 1)) if indices else set()
        if pattern == "data_{i}.pt":
            wanted |= written
        missing = tuple(sorted(wanted - indices))
        if missing:
            gaps.append(Gap(pattern, missing))
    return tuple(gaps)


def hidden_size_from_config(config: Mapping[str, Any]) -> int | None:
    """``hidden_size`` or ``text_config.hidden_size`` of a Hugging Face config.json."""
    hidden = _positive_int(config.get("hidden_size"))
    text = config.get("text_config")
    if hidden is None and isinstance(text, Mapping):
        hidden = _positive_int(text.get("hidden_size"))
    return hidden


def model_hidden_size(model: Path) -> int:
    """The hidden size from ``model`` (a model directory or its config.json).

    Raises ``ValueError`` saying what is wrong when it cannot be determined.
    """
    config_path = model / "config.json" if model.is_dir() else model
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--model {model}: no config.json at {config_path}") from None
    except (OSError, ValueError) as error:
        raise ValueError(f"--model {model}: cannot read {config_path}: {error}") from None
    hidden = hidden_size_from_config(config) if isinstance(config, Mapping) else None
    if hidden is None:
        raise ValueError(f"--model {model}: {config_path} has neither hidden_size nor "
                         "text_config.hidden_size")
    return hidden


@dataclass(frozen=True)
class Metadata:
    """What ``data_config.json`` (and ``sample_lengths.json``) record, read defensively."""

    layer_ids: tuple[int, ...] | None = None
    hidden_size: int | None = None
    model_path: str | None = None
    package_versions: Mapping[str, str] = field(default_factory=dict)
    num_samples: int | None = None
    file_pattern: str | None = None
    sample_lengths: Mapping[int, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _dig(data: Mapping[str, Any], *paths: tuple[str, ...]) -> Any:
    for path in paths:
        node: Any = data
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                break
            node = node[key]
        else:
            return node
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_metadata(directory: Path) -> Metadata:
    """Read ``data_config.json`` and ``sample_lengths.json`` if present; never raises."""
    problems: list[str] = []
    notes: list[str] = []
    layer_ids: tuple[int, ...] | None = None
    hidden: int | None = None
    model_path: str | None = None
    versions: dict[str, str] = {}
    num_samples: int | None = None
    pattern: str | None = None
    lengths: dict[int, int] = {}

    config_path = directory / DATA_CONFIG
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            problems.append(f"{DATA_CONFIG} is unreadable: {error}")
            config = None
        if config is not None and not isinstance(config, Mapping):
            problems.append(f"{DATA_CONFIG} is not a JSON object")
            config = None
        if config is not None:
            ids = _dig(config, ("hidden_states", "layer_ids"), ("layer_ids",))
            if isinstance(ids, list) and all(_is_int(i) for i in ids) and ids:
                layer_ids = tuple(ids)
            elif ids is not None:
                notes.append(f"{DATA_CONFIG}: layer_ids {ids!r} is not a list of integers; "
                             "ignored")
            hidden = _positive_int(_dig(config, ("model", "hidden_size"), ("hidden_size",)))
            value = _dig(config, ("model", "target_model_path"), ("target_model_path",),
                         ("model_path",))
            model_path = value if isinstance(value, str) else None
            value = _dig(config, ("reproducibility", "package_versions"), ("package_versions",))
            if isinstance(value, Mapping):
                versions = {str(k): str(v) for k, v in value.items()}
            value = _dig(config, ("speculators_version",))
            if isinstance(value, str):
                versions.setdefault("speculators", value)
            value = _dig(config, ("data", "num_samples"), ("num_samples",))
            num_samples = int(value) if _is_int(value) else None
            value = _dig(config, ("format", "file_pattern"), ("file_pattern",))
            pattern = value if isinstance(value, str) else None
            recorded = [f"layer_ids {list(layer_ids)}" if layer_ids else None,
                        f"hidden_size {hidden}" if hidden else None,
                        f"model {model_path}" if model_path else None,
                        ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or None]
            notes.insert(0, f"{DATA_CONFIG}: " + (
                "; ".join(r for r in recorded if r) or "records nothing verify uses"))

    lengths_path = directory / SAMPLE_LENGTHS
    if lengths_path.is_file():
        try:
            raw = json.loads(lengths_path.read_text(encoding="utf-8"))
            if isinstance(raw, Mapping):
                lengths = {int(k): int(v) for k, v in raw.items()}
        except (OSError, ValueError, TypeError) as error:
            notes.append(f"{SAMPLE_LENGTHS} is unreadable ({error}); ignored")

    return Metadata(layer_ids=layer_ids, hidden_size=hidden, model_path=model_path,
                    package_versions=versions, num_samples=num_samples, file_pattern=pattern,
                    sample_lengths=lengths, problems=tuple(problems), notes=tuple(notes))


def discover(directory: Path) -> list[SampleFile]:
    """The hidden-state files in ``directory``, in index order within each layout."""
    found: list[SampleFile] = []
    candidates = [p for p in directory.iterdir() if p.is_file()]
    sub = directory / HIDDEN_STATES_SUBDIR
    if sub.is_dir():
        candidates += [p for p in sub.iterdir() if p.is_file()]
    for path in candidates:
        name = path.relative_to(directory).as_posix()
        if path.suffix == ".pt":
            found_index = index_of(name)
            if found_index is None or path.parent != directory:
                continue  # token_freq.pt and the like are not samples
            found.append(SampleFile(path, name, Format.PT, found_index[1]))
        elif path.suffix == ".safetensors":
            found_index = index_of(name)
            index = found_index[1] if found_index else None
            found.append(SampleFile(path, name, Format.SAFETENSORS, index))

    def order(f: SampleFile) -> tuple[str, str, int, str]:
        return (f.format.value, str(Path(f.name).parent), -1 if f.index is None else f.index,
                f.name)

    return sorted(found, key=order)


# --------------------------------------------------------------------------- reading files


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
    if isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
        return len(value)
    return None


def _some(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:4])
    return shown + (f", ... ({len(indices)} in all)" if len(indices) > 4 else "")


def _nonfinite(torch: Any, tensor: Any) -> int:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return 0
    return int((~torch.isfinite(tensor)).sum().item())


def _check_pt(torch: Any, sample: SampleFile, meta: Metadata) -> _Observed:
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
                seen.reasons.append(f"layers {_some(off)} have {int(states[off[0]].shape[0])} "
                                    f"rows, but input_ids has {rows}")
    dtypes = Counter(_dtype_name(t.dtype) for t in states)
    seen.dtype = dtypes.most_common(1)[0][0]
    if len(dtypes) > 1:
        seen.reasons.append(f"layers differ in dtype: {dict(dtypes)}")
    bad = [(i, n) for i, t in enumerate(states) if (n := _nonfinite(torch, t))]
    if bad:
        seen.reasons.append(f"non-finite values (NaN/inf) in layers {_some([i for i, _ in bad])}"
                            f" ({sum(n for _, n in bad)} values)")

    if "loss_mask" in data and data["loss_mask"] is not None:
        length = _length(torch, data["loss_mask"])
        if length is None:
            seen.reasons.append("loss_mask is not a 1-D tensor")
        elif rows is not None and length != rows:
            seen.reasons.append(f"loss_mask has {length} entries, but input_ids has {rows}")
    return seen


def _check_safetensors(torch: Any, load_file: Any, sample: SampleFile) -> _Observed:
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
            seen.reasons.append(f"non-finite values (NaN/inf) in layers {_some(bad)} "
                                f"({int(per_layer.sum().item())} values)")
    mask = data.get("loss_mask")
    if mask is not None:
        length = _length(torch, mask)
        if length is None or (rows is not None and length != rows):
            seen.reasons.append(f"loss_mask of shape {_shape(mask)}, but token_ids has {rows}")
    return seen


def _import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except (ImportError, OSError) as error:
        raise TorchMissingError(_first_line(error)) from error


def _import_load_file() -> Any:
    try:
        return importlib.import_module("safetensors.torch").load_file
    except (ImportError, OSError, AttributeError):
        return None


def _majority(values: Iterable[Any]) -> Any:
    counted = Counter(v for v in values if v is not None)
    return counted.most_common(1)[0][0] if counted else None


# --------------------------------------------------------------------------- the command


def verify_dir(path: Path | str, *, model: Path | None = None) -> VerifyReport:
    """Check every hidden-state file under ``path``; see the module docstring.

    Raises :class:`TorchMissingError` when torch cannot be imported; every
    problem with the files themselves is a verdict in the report, not an error.
    """
    torch = _import_torch()
    directory = Path(path)
    if not directory.exists():
        return VerifyReport(directory, problems=(f"{directory} does not exist",))
    if not directory.is_dir():
        return VerifyReport(directory, problems=(f"{directory} is not a directory",))

    meta = read_metadata(directory)
    problems = list(meta.problems)
    notes = list(meta.notes)
    try:
        samples = discover(directory)
    except OSError as error:
        return VerifyReport(directory, problems=(f"cannot list {directory}: {error}",))
    if not samples:
        problems.append(f"no hidden-state files in {directory} (looked for data_{{i}}.pt, "
                        f"*.safetensors and {HIDDEN_STATES_SUBDIR}/*.safetensors)")

    load_file = None
    if any(s.format is Format.SAFETENSORS for s in samples):
        load_file = _import_load_file()
    observed = [_check_pt(torch, s, meta) if s.format is Format.PT
                else _check_safetensors(torch, load_file, s) for s in samples]

    # What every file must match: recorded facts first, else what most files agree on.
    if meta.layer_ids:
        layers, layers_from = len(meta.layer_ids), f"len(hidden_states.layer_ids) in {DATA_CONFIG}"
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
