"""Shared fixtures of the unit tests: a clean speccompat state around every test.

The unit tests run without vLLM, torch or speculators. Every test starts and
ends with nothing patched, no ``SPECCOMPAT_*`` variable set and the caches that
depend on them cleared, so no test can leak state into another.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

import speccompat
from speccompat import registry, targets
from speccompat.inprocess import rpc
from speccompat.patching import Patcher
from speccompat.record import Adapter, Side
from speccompat.versions import Environment, Package, spec

# detect() reads every installed distribution's metadata: no per-example deadline.
settings.register_profile("speccompat-unit", deadline=None)
settings.load_profile("speccompat-unit")


def pytest_configure(config: pytest.Config) -> None:
    # Hypothesis' example database and caches go under .pytest_cache (ignored by git)
    # instead of a .hypothesis/ folder in the checkout.
    # (nox runs with -p no:cacheprovider: then a folder in the system's temp dir.)
    cache = getattr(config, "cache", None)
    if cache is not None:
        home = str(cache.mkdir("hypothesis"))
    else:
        home = os.path.join(tempfile.gettempdir(), "speccompat-unit-hypothesis")
    set_hypothesis_home_dir(home)


# What a forbidden import would look like; the unit suite must never pull these in.
FORBIDDEN_MODULES = ("vllm", "torch", "speculators", "transformers")


def _clear_caches() -> None:
    rpc.unique_reply_is_bare.cache_clear()
    targets.module_source.cache_clear()


def _upstream_imported() -> set[str]:
    return {m for m in FORBIDDEN_MODULES if m in sys.modules}


@pytest.fixture(autouse=True)
def _clean_speccompat(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("SPECCOMPAT_"):
            monkeypatch.delenv(name)
    speccompat.revert()
    _clear_caches()
    before = _upstream_imported()
    yield
    speccompat.revert()
    _clear_caches()
    os.environ.pop(registry.ACTIVE_ENV, None)
    leaked = _upstream_imported() - before
    assert not leaked, f"this test imported {sorted(leaked)}; unit tests must not"


@pytest.fixture
def no_vllm_installed() -> None:
    """For tests about a Python without vLLM (the unit venv): skip where one is installed."""
    from speccompat.versions import detect

    found = detect().vllm
    if found is not None:
        pytest.skip(f"needs a Python without vLLM; found {found} ({found.distribution})")


def make_env(
    vllm: str | None = "0.16.0",
    speculators: str | None = "0.3.0",
    *,
    vllm_distribution: str = "vllm",
    transformers: str | None = None,
) -> Environment:
    """An Environment as ``detect()`` would build it, without reading any metadata."""
    return Environment(
        vllm=None if vllm is None else Package("vllm", vllm, vllm_distribution),
        speculators=None if speculators is None else Package(
            "speculators", speculators, "speculators"),
        torch=None,
        transformers=None if transformers is None else Package(
            "transformers", transformers, "transformers"),
        python="3.11.7",
    )


def _no_patch(patcher: Patcher) -> None:
    return None


def make_adapter(
    adapter_id: str = "test.adapter",
    *,
    patch: Callable[[Patcher], None] = _no_patch,
    probe: Callable[[], str | None] = lambda: None,
    vllm: str = ">=0.11.1",
    speculators: str | None = None,
    side: Side = Side.DRIVER,
    platform: str | None = None,
) -> Adapter:
    """A synthetic adapter record; its patch acts on objects the test owns."""
    return Adapter(
        id=adapter_id,
        summary=f"synthetic adapter {adapter_id}",
        why="unit tests need a record whose patch acts on objects they own",
        how="the patch the test passes",
        upstream="unit tests",
        upstream_ref="none found: a synthetic record",
        vllm=spec(vllm),
        speculators=None if speculators is None else spec(speculators),
        side=side,
        probe=probe,
        patch=patch,
        remove_when="never",
        platform=platform,
    )


@pytest.fixture
def env_factory() -> Callable[..., Environment]:
    return make_env


@pytest.fixture
def adapter_factory() -> Callable[..., Adapter]:
    return make_adapter


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` for throwaway modules; they leave ``sys.modules`` afterwards."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if origin.startswith(str(folder)) or name.startswith("sc_unit_"):
            sys.modules.pop(name, None)


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Module names no other test (or earlier run in this process) has used."""

    def make(prefix: str = "mod") -> str:
        return f"sc_unit_{prefix}_{uuid.uuid4().hex[:10]}"

    return make


class Target:
    """Objects a synthetic adapter patches, fresh for every test.

    ``module`` has a module-level function and a PEP 562 ``__getattr__`` (the way
    ``vllm.envs`` serves its variables); ``Engine`` has a staticmethod, a
    classmethod and a method that ``FastEngine`` inherits.
    """

    def __init__(self, name: str) -> None:
        calls: dict[str, int] = {"greet": 0}

        def greet(who: str) -> str:
            calls["greet"] += 1
            return f"hello {who}"

        def lazy(attr: str) -> str:
            if attr == "LAZY_FLAG":
                return "lazy"
            raise AttributeError(attr)

        class Engine:
            @staticmethod
            def version() -> str:
                return "old"

            @classmethod
            def build(cls) -> tuple[str, type]:
                return ("old", cls)

            def step(self) -> str:
                return "old step"

        class FastEngine(Engine):
            pass

        module = types.ModuleType(name)
        module.greet = greet  # type: ignore[attr-defined]
        module.__getattr__ = lazy  # type: ignore[method-assign]
        module.Engine = Engine  # type: ignore[attr-defined]
        module.FastEngine = FastEngine  # type: ignore[attr-defined]
        self.module = module
        self.Engine = Engine
        self.FastEngine = FastEngine
        self.calls = calls


@pytest.fixture
def target(unique_name: Callable[[str], str]) -> Target:
    return Target(unique_name("target"))
