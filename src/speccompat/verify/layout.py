"""Where the hidden-state files are: their names, indices, and the indices missing."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .report import Format, Gap, SampleFile

HIDDEN_STATES_SUBDIR = "hidden_states"

_INDEXED = re.compile(r"^(?P<stem>data_|hs_)(?P<index>\d+)(?P<ext>\.pt|\.safetensors)$")


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
