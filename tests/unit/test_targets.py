"""targets.py: side-effect-free source probes and the small patching tools adapters share."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from speccompat.targets import (
    GENERATOR,
    WORKER_EXTENSION,
    Proxy,
    decoder_stack,
    module_source,
    parameters,
    require_in_source,
    requires_argument,
    with_defaults,
    wrap_factory,
)

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


# --------------------------------------------------------------------------- signatures


class Scheduler:
    """The shape of vLLM 0.11.1's Scheduler.__init__: block_size became required."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 block_size: int, mm_registry: Any = None, include_finished_set: bool = False,
                 log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.block_size = block_size
        self.include_finished_set = include_finished_set


class OldScheduler:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 include_finished_set: bool = False) -> None:
        self.vllm_config = vllm_config


def test_requires_argument() -> None:
    assert requires_argument(Scheduler.__init__, "block_size")
    assert requires_argument(Scheduler, "block_size")
    assert not requires_argument(Scheduler.__init__, "mm_registry")  # has a default
    assert not requires_argument(OldScheduler.__init__, "block_size")  # absent
    assert not requires_argument(Scheduler.__init__, "nonexistent")


def test_parameters() -> None:
    params = parameters(Scheduler.__init__)
    assert list(params)[:5] == ["self", "vllm_config", "kv_cache_config",
                                "structured_output_manager", "block_size"]
    assert params["log_stats"].default is False


# --------------------------------------------------------------------------- with_defaults


def test_with_defaults_fills_what_the_consumer_does_not_pass() -> None:
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=16))
    build = with_defaults(
        Scheduler, block_size=lambda kwargs: kwargs["vllm_config"].cache_config.block_size)
    scheduler = build(vllm_config=config, kv_cache_config=None, structured_output_manager=None)
    assert isinstance(scheduler, Scheduler)
    assert scheduler.block_size == 16
    # The consumer's own value wins.
    explicit = build(vllm_config=config, kv_cache_config=None, structured_output_manager=None,
                     block_size=32)
    assert explicit.block_size == 32


def test_with_defaults_plain_values_and_positional_arguments() -> None:
    build = with_defaults(Scheduler, block_size=8, include_finished_set=True)
    scheduler = build("cfg", None, None)
    assert scheduler.vllm_config == "cfg"
    assert scheduler.block_size == 8
    assert scheduler.include_finished_set is True


def test_with_defaults_looks_like_the_original() -> None:
    build = with_defaults(Scheduler, block_size=8)
    assert build.__name__ == "Scheduler"
    assert build.__qualname__ == Scheduler.__qualname__
    assert build.__wrapped__ is Scheduler  # type: ignore[attr-defined]
    assert inspect.unwrap(build) is Scheduler


def test_with_defaults_computes_a_default_only_when_missing() -> None:
    build = with_defaults(
        Scheduler, block_size=lambda kwargs: kwargs["vllm_config"].cache_config.block_size)
    scheduler = build("cfg-passed-positionally", None, None, block_size=64)
    assert scheduler.block_size == 64


def test_with_defaults_respects_positional_arguments() -> None:
    build = with_defaults(Scheduler, block_size=8)
    scheduler = build("cfg", None, None, 64)
    assert scheduler.block_size == 64


# --------------------------------------------------------------------------- Proxy / wrap_factory


class Executor:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.log: list[str] = []

    def collective_rpc(self, method: str) -> list[str]:
        self.log.append(method)
        return [method] * self.world_size


class OneReply(Proxy):
    """A view that changes one method and forwards the rest."""

    def collective_rpc(self, method: str) -> str:
        result: list[str] = self.inner.collective_rpc(method)
        return result[0]


class Counting(Proxy):
    def __init__(self, target: Any) -> None:
        super().__init__(target)
        object.__setattr__(self, "count", 0)

    def collective_rpc(self, method: str) -> Any:
        object.__setattr__(self, "count", object.__getattribute__(self, "count") + 1)
        return self.inner.collective_rpc(method)


def test_proxy_forwards_and_overrides() -> None:
    real = Executor(2)
    view = OneReply(real)
    assert view.world_size == 2
    assert view.collective_rpc("ping") == "ping"
    assert real.log == ["ping"]
    view.world_size = 4  # writes reach the real object
    assert real.world_size == 4
    assert "world_size" not in vars(view)
    assert view.inner is real and view.unwrapped is real
    with pytest.raises(AttributeError):
        _ = view.missing


def test_proxies_compose() -> None:
    real = Executor(3)
    inner = OneReply(real)
    outer = Counting(inner)
    assert outer.collective_rpc("x") == "x"  # Counting -> OneReply -> real
    assert outer.count == 1
    assert outer.inner is inner
    assert outer.unwrapped is real
    assert outer.world_size == 3


def test_wrap_factory() -> None:
    build = wrap_factory(Executor, OneReply)
    view = build(world_size=2)
    assert isinstance(view, OneReply)
    assert isinstance(view.unwrapped, Executor)
    assert view.collective_rpc("a") == "a"
    assert build.__name__ == "Executor"
    assert build.__qualname__ == Executor.__qualname__
    assert build.__doc__ == Executor.__doc__
    assert build.__wrapped__ is Executor  # type: ignore[attr-defined]
    stacked = wrap_factory(build, Counting)
    outer = stacked(5)
    assert isinstance(outer, Counting)
    assert isinstance(outer.inner, OneReply)
    assert outer.unwrapped.world_size == 5
    assert stacked.__name__ == "Executor"


# --------------------------------------------------------------------------- decoder_stack


class Stack:
    def __init__(self) -> None:
        self.layers = ["layer0", "layer1"]


class CausalLM:
    """LlamaForCausalLM and friends: the stack is ``.model``."""

    def __init__(self) -> None:
        self.model = Stack()


class KimiK25_v015:  # vLLM 0.15.x: get_language_model() is the stack itself
    def __init__(self) -> None:
        self.language_model = Stack()
        self.vision_tower = SimpleNamespace()

    def get_language_model(self) -> Stack:
        return self.language_model


class KimiK25_v016:  # vLLM 0.16.0+: get_language_model() is a causal LM
    def __init__(self) -> None:
        self.language_model = CausalLM()

    def get_language_model(self) -> CausalLM:
        return self.language_model


def test_decoder_stack_of_a_causal_lm() -> None:
    model = CausalLM()
    assert decoder_stack(model) is model.model


def test_decoder_stack_of_kimi_on_vllm_0_15() -> None:
    model = KimiK25_v015()
    assert decoder_stack(model) is model.language_model


def test_decoder_stack_of_kimi_on_vllm_0_16() -> None:
    model = KimiK25_v016()
    assert decoder_stack(model) is model.language_model.model


def test_decoder_stack_of_a_bare_stack() -> None:
    stack = Stack()
    assert decoder_stack(stack) is stack


def test_decoder_stack_not_found() -> None:
    class Vision:
        model = SimpleNamespace(encoder=[])

        def get_language_model(self) -> Any:
            return SimpleNamespace()

    with pytest.raises(LookupError, match="cannot find the decoder layers of Vision"):
        decoder_stack(Vision())
    with pytest.raises(LookupError, match="SimpleNamespace"):
        decoder_stack(SimpleNamespace(model=None))


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
