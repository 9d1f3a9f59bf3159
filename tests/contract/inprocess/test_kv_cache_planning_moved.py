"""KV-cache planning helpers leave kv_cache_utils (vLLM 0.33.0); the old names come back."""

from __future__ import annotations

import importlib
import subprocess

import speccompat
from speccompat.inprocess.adapters.kv_cache_planning_moved import ID, MOVED, NEW, OLD
from support import needs_adapter, requires_speculators, requires_vllm, run_python

pytestmark = [requires_vllm, requires_speculators]
applies = needs_adapter(ID)


def test_raw_helpers_live_where_the_release_puts_them() -> None:
    old = importlib.import_module(OLD)
    try:
        new = importlib.import_module(NEW)
    except ImportError:
        assert all(hasattr(old, name) for name in MOVED)  # before 0.33.0
        return
    assert all(hasattr(new, name) for name in MOVED)
    assert not any(hasattr(old, name) for name in MOVED)


GENERATOR_IMPORT = (
    "import speccompat; speccompat.apply(exclude={exclude!r}, strict=False)\n"
    "from speculators.data_generation import vllm_hidden_states_generator as g\n"
    "import vllm.v1.core.kv_cache_planning as p\n"
    # Another adapter may wrap one of them in the generator (call signature changes):
    # its original is the alias.
    "print('SAME', all(getattr(getattr(g, n), '__wrapped__', getattr(g, n)) is getattr(p, n)"
    " for n in {moved!r}))\n"
)


def run(exclude: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    script = GENERATOR_IMPORT.format(exclude=exclude, moved=MOVED)
    return run_python("-c", script)


@applies
def test_generator_imports_the_moved_helpers() -> None:
    done = run(())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SAME True" in done.stdout


@applies
def test_generator_fails_without_it() -> None:
    done = run((ID,))
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "kv_cache_utils" in done.stderr


@applies
def test_revert_removes_the_aliases() -> None:
    old = importlib.import_module(OLD)
    speccompat.apply(only=(ID,), strict=False)
    try:
        assert all(hasattr(old, name) for name in MOVED)
    finally:
        speccompat.revert()
    assert not any(hasattr(old, name) for name in MOVED)
