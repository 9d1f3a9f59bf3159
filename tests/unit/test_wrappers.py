"""wrappers.py: views of real objects, and class stand-ins that keep the real class's types."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from types import SimpleNamespace
from typing import Any

import pytest

from speccompat.wrappers import Proxy, stand_in, with_defaults, wrap_factory


class Scheduler:
    """The shape of vLLM 0.11.1's Scheduler.__init__: block_size became required."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 block_size: int, mm_registry: Any = None, include_finished_set: bool = False,
                 log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.block_size = block_size
        self.include_finished_set = include_finished_set


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


# --------------------------------------------------------------------------- types kept


class Interface(ABC):
    """An ABC base, as vLLM's Executor and SchedulerInterface are."""

    @abstractmethod
    def collective_rpc(self, method: str) -> Any: ...


class RealExecutor(Interface):
    KIND = "multiproc"
    supports_pp = True

    def __init__(self, world_size: int = 1) -> None:
        self.world_size = world_size

    def collective_rpc(self, method: str) -> list[str]:
        return [method] * self.world_size

    @classmethod
    def create(cls, world_size: int) -> Any:
        return cls(world_size)

    @staticmethod
    def describe() -> str:
        return "the real executor"


class SubExecutor(RealExecutor):
    pass


def _assert_stands_for(name: Any, real: type, made: Any) -> None:
    """What the consumer does with ``name`` behaves as it did with ``real``."""
    assert isinstance(name, type)
    # isinstance: what it builds, the real class's own instances, and nothing else.
    assert isinstance(made, name) and isinstance(made, real)
    assert isinstance(real.__new__(real), name)
    assert isinstance(SubExecutor(), name) is issubclass(SubExecutor, real)
    assert not isinstance(object(), name)
    assert not isinstance(name, name)
    # issubclass, both ways.
    assert issubclass(name, real) and issubclass(real, name)
    assert issubclass(SubExecutor, name) is issubclass(SubExecutor, real)
    assert not issubclass(int, name)
    for base in real.__mro__:
        assert issubclass(name, base)
    # Class attributes, methods and names are the real class's.
    for attribute in ("KIND", "supports_pp", "collective_rpc", "__init__", "__module__",
                      "__name__", "__qualname__", "__doc__"):
        if hasattr(real, attribute):
            assert getattr(name, attribute) == getattr(real, attribute), attribute
    assert inspect.signature(name) == inspect.signature(real)
    assert inspect.unwrap(name) is real


def test_proxy_forwards_its_class() -> None:
    real = RealExecutor(2)
    view = OneReply(real)
    assert view.__class__ is RealExecutor
    assert isinstance(view, RealExecutor) and isinstance(view, Interface)
    assert isinstance(view, OneReply) and isinstance(view, Proxy)  # still the view
    assert type(view) is OneReply
    outer = Counting(view)
    assert outer.__class__ is RealExecutor
    assert isinstance(outer, RealExecutor) and isinstance(outer, Counting)
    assert not isinstance(outer, OneReply)  # views do not see each other's classes
    assert not isinstance(view, SubExecutor)


def test_wrap_factory_keeps_types() -> None:
    name = wrap_factory(RealExecutor, OneReply)
    view = name(2)
    assert isinstance(view, OneReply) and view.collective_rpc("a") == "a"
    _assert_stands_for(name, RealExecutor, view)
    # Stacked, as several adapters wrap the generator's MultiprocExecutor.
    stacked = wrap_factory(name, Counting)
    outer = stacked(world_size=3)
    assert isinstance(outer, Counting) and isinstance(outer.inner, OneReply)
    _assert_stands_for(stacked, RealExecutor, outer)
    assert isinstance(view, stacked) and isinstance(outer, name)


def test_class_attributes_and_class_level_calls() -> None:
    name: Any = wrap_factory(RealExecutor, OneReply)
    assert name.describe() == "the real executor"
    built = name.create(4)  # a classmethod builds through the name, as the consumer would
    assert isinstance(built, OneReply) and built.world_size == 4
    assert RealExecutor.create(1).__class__ is RealExecutor  # the real class is untouched
    name.LOCAL = 1  # a class attribute set through the name stays on the name
    assert not hasattr(RealExecutor, "LOCAL")


def test_with_defaults_keeps_types() -> None:
    name = with_defaults(RealExecutor, world_size=5)
    made = name()
    assert type(made) is RealExecutor and made.world_size == 5
    _assert_stands_for(name, RealExecutor, made)
    layered = wrap_factory(with_defaults(RealExecutor, world_size=2), OneReply)
    assert layered().collective_rpc("x") == "x"
    _assert_stands_for(layered, RealExecutor, layered())


def test_stand_in_of_a_plain_class() -> None:
    name = stand_in(Scheduler, lambda *args, **kwargs: Scheduler(*args, block_size=4, **kwargs))
    made = name("cfg", None, None)
    assert type(made) is Scheduler and made.block_size == 4
    assert isinstance(made, name) and issubclass(Scheduler, name) and issubclass(name, Scheduler)
    assert type(name) is not type(wrap_factory(RealExecutor, OneReply))  # each its metaclass


def test_a_class_derived_from_a_stand_in_is_an_ordinary_class() -> None:
    name: Any = wrap_factory(RealExecutor, OneReply)

    class Mine(name):  # type: ignore[misc]
        pass

    mine = Mine(3)
    assert type(mine) is Mine and not isinstance(mine, Proxy)
    assert isinstance(mine, Mine) and isinstance(mine, name) and isinstance(mine, RealExecutor)
    assert not isinstance(RealExecutor(), Mine)
    assert issubclass(Mine, RealExecutor) and not issubclass(RealExecutor, Mine)


def test_functions_stay_functions() -> None:
    def build(world_size: int) -> RealExecutor:
        """Builds one."""
        return RealExecutor(world_size)

    wrapped = wrap_factory(build, OneReply)
    assert not isinstance(wrapped, type)
    assert wrapped.__name__ == "build" and wrapped.__doc__ == "Builds one."
    assert inspect.unwrap(wrapped) is build
    assert isinstance(wrapped(2), OneReply)
    defaulted = with_defaults(build, world_size=7)
    assert not isinstance(defaulted, type) and defaulted().world_size == 7
