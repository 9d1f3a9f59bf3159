"""patching.py, through apply()/revert() and directly: exact inverses, marks, deferred targets."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import speccompat
from speccompat import Adapter, AdapterError, Environment, State, registry
from speccompat.patching import _FINDER, MARK, Patcher, _HookedLoader, patched_by
from speccompat.registry import ACTIVE_ENV
from speccompat.wrappers import Proxy

if TYPE_CHECKING:
    from conftest import Target

MakeEnv = Callable[..., Environment]
MakeAdapter = Callable[..., Adapter]


def _patch_everything(target: Target, calls: list[int]) -> Callable[[Patcher], None]:
    """One adapter touching each kind of target the design names."""

    def patch(patcher: Patcher) -> None:
        calls.append(1)
        patcher.replace(target.Engine, "version", staticmethod(lambda: "new"))
        patcher.replace(target.Engine, "build", classmethod(lambda cls: ("new", cls)))
        patcher.wrap(target.module, "greet", lambda original: lambda who: original(who).upper())
        patcher.replace(target.module, "LAZY_FLAG", "patched")
        patcher.replace(target.FastEngine, "step", lambda self: "new step")

    return patch


def test_apply_apply_revert_restores_the_identical_objects(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    engine, fast, module = target.Engine, target.FastEngine, target.module
    version, build = vars(engine)["version"], vars(engine)["build"]
    step, greet = vars(engine)["step"], module.greet
    assert isinstance(version, staticmethod) and isinstance(build, classmethod)
    assert "LAZY_FLAG" not in vars(module) and module.LAZY_FLAG == "lazy"
    assert "step" not in vars(fast)

    calls: list[int] = []
    adapter = adapter_factory("t.all", patch=_patch_everything(target, calls))
    env = env_factory()
    registry._apply(adapters=[adapter], environment=env)
    report = registry._apply(adapters=[adapter], environment=env)
    assert report.state_of("t.all") is State.APPLIED
    assert calls == [1]

    # Patched, each through the right descriptor.
    assert engine.version() == "new" and engine().version() == "new"
    assert fast.build() == ("new", fast)
    assert module.greet("x") == "HELLO X"
    assert module.LAZY_FLAG == "patched"
    assert fast().step() == "new step"
    assert engine().step() == "old step"
    for owner, name in [(engine, "version"), (engine, "build"), (module, "greet"),
                        (module, "LAZY_FLAG"), (fast, "step")]:
        if name != "LAZY_FLAG":  # a str takes no mark
            assert patched_by(vars(owner)[name]) == "t.all", name

    speccompat.revert()
    assert vars(engine)["version"] is version
    assert vars(engine)["build"] is build
    assert vars(engine)["step"] is step
    assert module.greet is greet
    assert "LAZY_FLAG" not in vars(module)  # did not exist: deleted again
    assert module.LAZY_FLAG == "lazy"  # module __getattr__ serves it again
    assert "step" not in vars(fast)  # inherited: the subclass has no own attribute again
    assert fast.step is engine.step
    assert engine.version() == "old" and fast.build() == ("old", fast)
    assert patched_by(version) is None and patched_by(greet) is None
    assert speccompat.active() == ()


def test_revert_then_apply_again(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    calls: list[int] = []
    adapter = adapter_factory("t.all", patch=_patch_everything(target, calls))
    for _ in range(3):
        report = registry._apply(adapters=[adapter], environment=env_factory())
        assert report.state_of("t.all") is State.APPLIED
        assert target.module.greet("x") == "HELLO X"
        speccompat.revert()
        assert target.module.greet("x") == "hello x"
    assert calls == [1, 1, 1]


def test_instance_attribute_that_did_not_exist_is_deleted_again(target: Target) -> None:
    engine = target.Engine()
    patcher = Patcher("t.instance")
    patcher.replace(engine, "step", lambda: "instance step")
    assert engine.step() == "instance step"
    assert patcher.patch_count == 1
    patcher.revert()
    assert "step" not in vars(engine)
    assert engine.step() == "old step"
    assert patcher.patch_count == 0


def test_replace_refuses_a_name_that_does_not_exist(target: Target) -> None:
    patcher = Patcher("t.typo")
    with pytest.raises(AdapterError, match="has no attribute 'stpe'"):
        patcher.replace(target.Engine, "stpe", lambda self: None)
    assert not hasattr(target.Engine, "stpe")
    assert patcher.patch_count == 0


def test_second_replace_by_the_same_adapter_raises(target: Target) -> None:
    greet = target.module.greet
    patcher = Patcher("t.twice")
    patcher.replace(target.module, "greet", lambda who: "one")
    with pytest.raises(AdapterError, match="already patched") as caught:
        patcher.replace(target.module, "greet", lambda who: "two")
    assert caught.value.adapter_id == "t.twice"
    assert target.module.greet("x") == "one"
    # A second Patcher of the same adapter is refused too: the mark is on the object.
    with pytest.raises(AdapterError, match="already patched"):
        Patcher("t.twice").wrap(target.module, "greet", lambda original: original)
    patcher.revert()
    assert target.module.greet is greet


def test_second_replace_of_an_inherited_method_raises(target: Target) -> None:
    patcher = Patcher("t.twice")
    patcher.replace(target.FastEngine, "step", lambda self: "one")
    with pytest.raises(AdapterError, match="already patched"):
        patcher.replace(target.FastEngine, "step", lambda self: "two")
    patcher.revert()
    assert "step" not in vars(target.FastEngine)


def test_two_adapters_layer_and_unwind_in_reverse(target: Target) -> None:
    greet = target.module.greet
    first, second = Patcher("t.first"), Patcher("t.second")
    first.wrap(target.module, "greet", lambda original: lambda who: f"1({original(who)})")
    layer_one = target.module.greet
    second.wrap(target.module, "greet", lambda original: lambda who: f"2({original(who)})")
    assert target.module.greet("x") == "2(1(hello x))"
    assert patched_by(target.module.greet) == "t.second"
    second.revert()
    assert target.module.greet is layer_one
    first.revert()
    assert target.module.greet is greet


def test_wrap_resolves_through_getattr(target: Target) -> None:
    seen: list[Any] = []

    def make(current: Any) -> Any:
        seen.append(current)
        return lambda self: f"wrapped {current(self)}"

    patcher = Patcher("t.wrap")
    patcher.wrap(target.FastEngine, "step", make)
    assert seen == [target.Engine.step]  # inherited value, found through getattr
    assert target.FastEngine().step() == "wrapped old step"
    patcher.revert()
    assert "step" not in vars(target.FastEngine)


def test_patched_by() -> None:
    def plain() -> None:
        return None

    assert patched_by(plain) is None
    assert patched_by(42) is None
    marked = types.SimpleNamespace(**{MARK: "t.x"})
    assert patched_by(marked) == "t.x"
    assert patched_by(types.SimpleNamespace(**{MARK: 7})) is None


def test_unmarkable_replacements_are_still_recorded(target: Target) -> None:
    patcher = Patcher("t.builtin")
    patcher.replace(target.module, "greet", len)  # a builtin takes no attributes
    assert target.module.greet("abc") == 3
    patcher.revert()
    assert target.module.greet("x") == "hello x"


def test_wrap_keeps_a_staticmethod_static(target: Target) -> None:
    patcher = Patcher("t.static")
    patcher.wrap(target.Engine, "version", lambda original: lambda: f"wrapped {original()}")
    try:
        assert target.Engine.version() == "wrapped old"
        assert target.Engine().version() == "wrapped old"
    finally:
        patcher.revert()


def test_wrap_keeps_a_classmethod_bound_to_the_caller(target: Target) -> None:
    patcher = Patcher("t.classmethod")
    patcher.wrap(target.Engine, "build", lambda original: lambda *a: original(*a))
    try:
        assert target.FastEngine.build() == ("old", target.FastEngine)
        assert target.Engine().build() == ("old", target.Engine)
    finally:
        patcher.revert()


def test_wrap_keeps_a_class_a_class(target: Target) -> None:
    engine = target.Engine
    patcher = Patcher("t.class")
    # make returns a plain function (scheduler_block_size's speculators 0.4.0 wrapper does).
    patcher.wrap(target.module, "Engine", lambda original: lambda *a: original(*a))
    try:
        name = target.module.Engine
        assert isinstance(name, type) and name is not engine
        assert patched_by(name) == "t.class" and patched_by(engine) is None
        made = name()
        assert type(made) is engine and isinstance(made, name)
        assert issubclass(target.FastEngine, name) and issubclass(name, engine)
        assert name.version() == engine.version()
    finally:
        patcher.revert()
    assert target.module.Engine is engine


def test_proxy_replacement_survives_revert_and_reapply(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    real = types.SimpleNamespace(name="real torch")
    vars(target.module)["torch"] = real

    def patch(patcher: Patcher) -> None:
        patcher.replace(target.module, "torch", Proxy(target.module.torch))

    # Regression: the mark once went through Proxy.__setattr__ onto the real object, which
    # then stayed "already patched" after revert() (the cpu_mem_get_info adapter's _Torch).
    adapter = adapter_factory("t.proxy", patch=patch)
    assert registry._apply(adapters=[adapter], environment=env_factory()).ok
    view: Any = target.module.torch
    assert isinstance(view, Proxy)
    assert patched_by(view) == "t.proxy"
    assert view.name == "real torch"
    assert patched_by(real) is None
    speccompat.revert()
    assert vars(target.module)["torch"] is real
    assert patched_by(real) is None, "the proxied object still carries the mark"
    report = registry._apply(adapters=[adapter], environment=env_factory())
    assert report.state_of("t.proxy") is State.APPLIED


def test_slots_owner_is_restored() -> None:
    class Slotted:
        __slots__ = ("value",)

        def __init__(self) -> None:
            self.value = "original"

    owner = Slotted()
    patcher = Patcher("t.slots")
    patcher.replace(owner, "value", "patched")
    patcher.revert()
    assert getattr(owner, "value", "<deleted>") == "original"


# --------------------------------------------------------------------------- deferred targets

MODULE_SOURCE = """
VALUE = 41


def answer():
    return VALUE + 1
"""


def _write_module(folder: Path, name: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(MODULE_SOURCE, encoding="utf-8")
    importlib.invalidate_caches()
    return path


def _finder_installed() -> bool:
    return any(f is _FINDER for f in sys.meta_path)


def test_on_import_fires_right_after_the_import(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("deferred")
    _write_module(module_dir, name)
    seen: list[tuple[types.ModuleType, int, bool]] = []

    def hook(module: types.ModuleType) -> None:
        seen.append((module, module.VALUE, sys.modules.get(name) is module))

    patcher = Patcher("t.deferred")
    patcher.on_import(name, hook)
    assert name not in sys.modules
    assert seen == []
    assert patcher.waiting_for == [name]
    assert _finder_installed()

    module = importlib.import_module(name)
    assert seen == [(module, 41, True)]  # ran once, on the executed module
    assert patcher.waiting_for == []
    assert not _finder_installed()  # nothing left to watch
    # The real loader is in place: tools reading __loader__ see no trace of speccompat.
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)
    assert not isinstance(module.__loader__, _HookedLoader)
    assert module.__spec__ is not None and module.__spec__.loader is module.__loader__
    assert module.answer() == 42

    patcher.revert()
    del sys.modules[name]
    importlib.import_module(name)
    assert len(seen) == 1  # a fresh import after revert() is not hooked


def test_on_import_reverted_before_the_import_never_fires(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("never")
    _write_module(module_dir, name)
    seen: list[types.ModuleType] = []
    patcher = Patcher("t.never")
    patcher.on_import(name, seen.append)
    patcher.revert()
    assert patcher.waiting_for == []
    assert not _finder_installed()
    importlib.import_module(name)
    assert seen == []


def test_on_import_of_an_imported_module_runs_at_once(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("loaded")
    _write_module(module_dir, name)
    module = importlib.import_module(name)
    seen: list[types.ModuleType] = []
    patcher = Patcher("t.loaded")
    patcher.on_import(name, seen.append)
    assert seen == [module]
    assert patcher.waiting_for == []
    assert not _finder_installed()


def test_on_import_of_a_submodule(module_dir: Path, unique_name: Callable[[str], str]) -> None:
    package = unique_name("pkg")
    (module_dir / package).mkdir()
    (module_dir / package / "__init__.py").write_text("", encoding="utf-8")
    _write_module(module_dir / package, "generator")
    full = f"{package}.generator"
    seen: list[types.ModuleType] = []
    patcher = Patcher("t.sub")
    patcher.on_import(full, seen.append)
    importlib.import_module(package)
    assert seen == []
    module = importlib.import_module(full)
    assert seen == [module]
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)
    patcher.revert()


def test_on_import_during_the_targets_own_import_is_not_silent(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    consumer, helper = unique_name("consumer"), unique_name("helper")
    # The consumer imports a helper first; the helper registers a hook on the consumer.
    (module_dir / f"{consumer}.py").write_text(f"import {helper}\nVALUE = 1\n")
    (module_dir / f"{helper}.py").write_text(
        "from speccompat.errors import AdapterError\n"
        "from speccompat.patching import Patcher\n"
        "FIRED = []\n"
        "REFUSED = []\n"
        "PATCHER = Patcher('t.mid_import')\n"
        "try:\n"
        f"    PATCHER.on_import({consumer!r}, FIRED.append)\n"
        "except AdapterError as exc:\n"
        "    REFUSED.append(exc)\n"
    )
    importlib.invalidate_caches()
    importlib.import_module(consumer)
    helper_module = sys.modules[helper]
    try:
        # Either the hook ran once the consumer finished, or on_import said it could not.
        assert helper_module.FIRED or helper_module.REFUSED
    finally:
        helper_module.PATCHER.revert()
    assert not _finder_installed()


def test_several_hooks_on_one_module_fire_in_order(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("shared")
    _write_module(module_dir, name)
    order: list[str] = []
    first, second = Patcher("t.first"), Patcher("t.second")
    first.on_import(name, lambda m: order.append("first"))
    second.on_import(name, lambda m: order.append("second"))
    importlib.import_module(name)
    assert order == ["first", "second"]
    assert first.waiting_for == second.waiting_for == []
    first.revert()
    second.revert()


def test_deferred_adapter_through_apply(
    module_dir: Path, unique_name: Callable[[str], str],
    env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    name = unique_name("consumer")
    _write_module(module_dir, name)

    def patch(patcher: Patcher) -> None:
        patcher.on_import(name, lambda module: patcher.wrap(
            module, "answer", lambda original: lambda: original() * 10))

    adapter = adapter_factory("t.consumer", patch=patch)
    report = registry._apply(adapters=[adapter], environment=env_factory())
    assert report.state_of("t.consumer") is State.APPLIED
    assert report.outcomes[0].reason.endswith(f"; patches {name} on import")
    assert json.loads(os.environ[ACTIVE_ENV]) == ["t.consumer"]

    module = importlib.import_module(name)
    assert module.answer() == 420
    assert patched_by(module.answer) == "t.consumer"
    speccompat.revert()
    assert module.answer() == 42
    assert patched_by(module.answer) is None


def test_deferred_adapter_reverted_before_import(
    module_dir: Path, unique_name: Callable[[str], str],
    env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    name = unique_name("late")
    _write_module(module_dir, name)
    fired: list[types.ModuleType] = []
    adapter = adapter_factory("t.late", patch=lambda p: p.on_import(name, fired.append))
    registry._apply(adapters=[adapter], environment=env_factory())
    speccompat.revert()
    importlib.import_module(name)
    assert fired == []
    assert not _finder_installed()


def test_add_module_serves_a_missing_submodule_until_revert(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    package = unique_name("pkg")
    (module_dir / package).mkdir()
    (module_dir / package / "__init__.py").write_text("def helper():\n    return 7\n")
    importlib.invalidate_caches()
    parent = importlib.import_module(package)
    moved = types.ModuleType(f"{package}.moved")
    moved.helper = parent.helper  # type: ignore[attr-defined]
    patcher = Patcher("t.moved")
    patcher.add_module(f"{package}.moved", moved)
    consumer: dict[str, Any] = {}  # what a consumer written for the newer layout runs
    exec(f"from {package}.moved import helper", consumer)
    assert consumer["helper"]() == 7
    assert patched_by(sys.modules[f"{package}.moved"]) == "t.moved"
    assert parent.moved is moved  # type: ignore[attr-defined]
    with pytest.raises(AdapterError, match="exists"):
        Patcher("t.other").add_module(f"{package}.moved", types.ModuleType("x"))
    patcher.revert()
    assert f"{package}.moved" not in sys.modules and not hasattr(parent, "moved")
    with pytest.raises(ImportError):
        exec(f"from {package}.moved import helper", {})


def test_add_module_refuses_to_shadow_a_real_module(
    module_dir: Path, unique_name: Callable[[str], str],
) -> None:
    name = unique_name("real")
    _write_module(module_dir, name)
    with pytest.raises(AdapterError, match="exists"):
        Patcher("t.shadow").add_module(name, types.ModuleType(name))
    assert name not in sys.modules
