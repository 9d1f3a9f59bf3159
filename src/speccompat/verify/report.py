"""What ``verify`` reports: a verdict per file, the gaps in numbered sequences, and what
every file was expected to match. Plain data; nothing here reads a file."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


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
