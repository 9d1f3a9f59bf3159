"""targets.py: side-effect-free source probes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from speccompat.targets import GENERATOR, WORKER_EXTENSION, module_source, require_in_source

# --------------------------------------------------------------------------- module_source

SUBMODULE = '''"""A consumer module."""
import this_does_not_exist  # never executed: module_source only reads


def extract():
    return collective_rpc("_get_captured_states", unique_reply_rank=0)[0]
'''


@pytest.fixture
def exploding_package(module_dir: Path, unique_name: Callable[[str], str]) -> str:
    """A package whose __init__ raises on import, with submodules, like speculators' own."""
    name = unique_name("pkg")
    root = module_dir / name
    (root / "data_generation").mkdir(parents=True)
    (root / "__init__.py").write_text("raise RuntimeError('the package was imported')\n")
    (root / "data_generation" / "__init__.py").write_text(
        "raise RuntimeError('the subpackage was imported')\n")
    (root / "data_generation" / "generator.py").write_text(SUBMODULE)
    return name


def test_module_source_does_not_import(exploding_package: str) -> None:
    name = exploding_package
    source = module_source(f"{name}.data_generation.generator")
    assert source == SUBMODULE
    assert name not in sys.modules
    assert f"{name}.data_generation" not in sys.modules
    assert f"{name}.data_generation.generator" not in sys.modules


def test_module_source_of_packages(exploding_package: str) -> None:
    name = exploding_package
    assert module_source(name) == "raise RuntimeError('the package was imported')\n"
    init = module_source(f"{name}.data_generation")
    assert init is not None and "subpackage" in init
    assert name not in sys.modules


def test_module_source_of_a_top_level_module(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("single")
    (module_dir / f"{name}.py").write_text("raise SystemExit('imported')\n")
    assert module_source(name) == "raise SystemExit('imported')\n"
    assert name not in sys.modules


def test_module_source_of_what_is_missing(exploding_package: str) -> None:
    assert module_source("sc_unit_not_installed_anywhere") is None
    assert module_source(f"{exploding_package}.data_generation.missing") is None
    assert module_source("sys") is None  # built in: no .py file
    assert module_source("speculators.data_generation.vllm_hidden_states_generator") is None


def test_module_source_of_an_installed_module() -> None:
    source = module_source("speccompat.targets")
    assert source is not None
    assert "def module_source" in source


def test_require_in_source(exploding_package: str) -> None:
    module = f"{exploding_package}.data_generation.generator"
    assert require_in_source(module, "unique_reply_rank=0", ")[0]") is None
    assert require_in_source(module) is None
    missing = require_in_source(module, "unique_reply_rank=0", "sample_tokens", "block_size")
    assert missing == f"{module} no longer contains ['sample_tokens', 'block_size']"
    absent = "sc_unit_absent.module"
    assert require_in_source(absent, "x") == f"{absent} is not installed"
    assert require_in_source(GENERATOR, "x") == f"{GENERATOR} is not installed"
    assert exploding_package not in sys.modules


def test_consumer_module_names() -> None:
    assert GENERATOR == "speculators.data_generation.vllm_hidden_states_generator"
    assert WORKER_EXTENSION == "speculators.data_generation.custom_worker"


SOURCE_DEFS = '''
from typing import overload


class Executor:
    @overload
    def collective_rpc(self, method: str) -> list: ...

    def collective_rpc(  # type: ignore[override]
        self,
        method: str,
        timeout: float | None = None,
        args: tuple = (),
        *,
        unique_reply_rank: int | None = None,  # the rank whose reply comes back
        **kwargs,
    ) -> object:
        responses = [1]

        return responses[0] if unique_reply_rank is not None else responses

    def sample_tokens(self, grammar_output) -> None:
        pass


def plan(vllm_config, groups: dict[str, int] = {"a": 1}, memory=0):
    return None


@register(
    "kimi",
)
class WithBases(
    Executor,
    metaclass=type,
):
    def __init__(self, vllm_config) -> None:
        self.device = "cpu"
'''


def test_source_def_reads_signatures_and_bodies(module_dir: Path) -> None:
    from speccompat.targets import module_source, source_def

    (module_dir / "fake_sourcedefs.py").write_text(SOURCE_DEFS)
    module_source.cache_clear()
    rpc = source_def("fake_sourcedefs", "Executor.collective_rpc")
    assert rpc is not None
    assert rpc.params == {"self": False, "method": False, "timeout": True, "args": True,
                          "unique_reply_rank": True, "kwargs": False}
    assert "responses[0] if unique_reply_rank" in rpc.text
    assert "def sample_tokens" not in rpc.text
    plan = source_def("fake_sourcedefs", "plan")
    assert plan is not None and plan.params == {"vllm_config": False, "groups": True,
                                                 "memory": True}
    bases = source_def("fake_sourcedefs", "WithBases.__init__")  # bases over several lines
    assert bases is not None and 'self.device = "cpu"' in bases.text
    assert source_def("fake_sourcedefs", "Executor.missing") is None
    assert source_def("fake_sourcedefs", "Missing.plan") is None
    assert source_def("no_such_module_here", "plan") is None
    assert "fake_sourcedefs" not in sys.modules  # read, never imported
