"""Reversible patches and post-import hooks, shared by every adapter.

A ``Patcher`` belongs to one adapter. It records the raw object it replaces
(read from ``__dict__``, so descriptors such as ``staticmethod`` come back as
the very same object), marks what it installs, refuses to patch a name twice,
and undoes everything in reverse order. Targets in modules that are not
imported yet are patched the moment the module finishes executing, so
``apply()`` works before or after the consumer's import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import AdapterError
from .wrappers import stand_in

MARK = "__speccompat_adapter__"
_MISSING = object()


@dataclass
class _Patch:
    owner: Any
    name: str
    original: Any
    replacement: Any


def patched_by(obj: object) -> str | None:
    """The id of the adapter that installed ``obj``, if speccompat did."""
    mark = getattr(obj, MARK, None)
    return mark if isinstance(mark, str) else None


class Patcher:
    """Records one adapter's patches so that ``revert`` restores the identical objects."""

    def __init__(self, adapter_id: str) -> None:
        self.adapter_id = adapter_id
        self._patches: list[_Patch] = []
        self._hooks: list[tuple[str, Callable[[ModuleType], None]]] = []
        self._modules: list[str] = []
        self.waiting_for: list[str] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        """Set ``owner.name = replacement``, remembering the raw original."""
        raw = (vars(owner).get(name, _MISSING) if hasattr(owner, "__dict__")
               else getattr(owner, name, _MISSING))
        if patched_by(raw) == self.adapter_id:
            raise AdapterError(self.adapter_id, f"{_describe(owner)}.{name} is already patched")
        if raw is _MISSING and not hasattr(owner, name):
            raise AdapterError(self.adapter_id, f"{_describe(owner)} has no attribute {name!r}")
        _mark(replacement, self.adapter_id)
        setattr(owner, name, replacement)
        self._patches.append(_Patch(owner, name, raw, replacement))

    def add(self, owner: Any, name: str, value: Any) -> None:
        """Give ``owner`` a name it lacks (an old import path); ``revert`` removes it again."""
        if hasattr(owner, name):
            raise AdapterError(self.adapter_id, f"{_describe(owner)} already has {name!r}")
        setattr(owner, name, value)
        self._patches.append(_Patch(owner, name, _MISSING, value))

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(current)``.

        A staticmethod or classmethod stays one: ``make`` gets its function (for a
        classmethod, the one taking ``cls`` first) and the result is wrapped again. A class
        stays a class: where ``make`` returns a plain callable, it is installed as a
        ``wrappers.stand_in``, so ``isinstance`` against the name keeps working.
        """
        raw = inspect.getattr_static(owner, name)
        if isinstance(raw, (staticmethod, classmethod)):
            self.replace(owner, name, type(raw)(make(raw.__func__)))
            return
        current = getattr(owner, name)
        replacement = make(current)
        if (isinstance(current, type) and callable(replacement)
                and not isinstance(replacement, type)):
            replacement = stand_in(current, replacement)
        self.replace(owner, name, replacement)

    def wrap_on_import(self, module: str, name: str, make: Callable[[Any], Any]) -> None:
        """``wrap`` the consumer's ``module.name``, now or right after ``module`` is imported."""
        self.on_import(module, lambda loaded: self.wrap(loaded, name, make))

    def on_import(self, module: str, patch: Callable[[ModuleType], None]) -> None:
        """Run ``patch(module)`` now if ``module`` is imported, else right after its import."""
        loaded = sys.modules.get(module)
        if loaded is not None:
            if not _finished(loaded):
                raise AdapterError(self.adapter_id, f"{module} is being imported right now; "
                                   "call apply() before or after that import")
            patch(loaded)
            return
        self._hooks.append((module, patch))
        self.waiting_for.append(module)
        _FINDER.watch(module, patch, self)

    def add_module(self, name: str, module: ModuleType) -> None:
        """Make ``import name`` find ``module``, for a module the installed package lacks
        (a consumer importing from where a newer release moved a name).

        Refuses a name that is imported or importable: it would shadow the real module.
        """
        parent, _, child = name.rpartition(".")
        if name in sys.modules or _importable(name):
            raise AdapterError(self.adapter_id, f"module {name} exists; not replacing it")
        owner = importlib.import_module(parent) if parent else None
        if owner is not None:
            self.add(owner, child, module)  # as the import system does for a submodule
        _mark(module, self.adapter_id)
        sys.modules[name] = module
        self._modules.append(name)

    def revert(self) -> None:
        while self._modules:
            name = self._modules.pop()
            if patched_by(sys.modules.get(name)) == self.adapter_id:
                del sys.modules[name]
        for module, hook in self._hooks:
            _FINDER.unwatch(module, hook)
        self._hooks.clear()
        self.waiting_for.clear()
        while self._patches:
            p = self._patches.pop()
            if p.original is _MISSING:
                delattr(p.owner, p.name)
            else:
                setattr(p.owner, p.name, p.original)

    def _fired(self, module: str) -> None:
        if module in self.waiting_for:
            self.waiting_for.remove(module)

    @property
    def patch_count(self) -> int:
        return len(self._patches)


# Adapter id -> its Patcher, for each adapter applied in this process, in the order applied.
# The registry keeps it (under its lock); an adapter that depends on what else is applied
# asks here (``applied``), so no adapter imports the registry, which imports the adapters.
APPLIED: dict[str, Patcher] = {}


def applied() -> tuple[str, ...]:
    """Ids of the adapters applied in this process."""
    return tuple(APPLIED)


def _mark(obj: Any, adapter_id: str) -> None:
    # object.__setattr__ first: a proxy would forward a plain setattr to what it wraps.
    for setter in (object.__setattr__, setattr):
        try:
            setter(obj, MARK, adapter_id)
            return
        except (AttributeError, TypeError):
            continue  # classes refuse object.__setattr__; builtins refuse both


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _finished(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def _describe(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or repr(owner)


class _HookedLoader(importlib.abc.Loader):
    """Runs the real loader, then the hooks registered for this module."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: tools that read __loader__ see no trace of us.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _FINDER.fire(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of watched modules."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._watch: dict[str, list[tuple[Callable[[ModuleType], None], Patcher]]] = {}
        self._busy = threading.local()

    def watch(self, module: str, hook: Callable[[ModuleType], None], owner: Patcher) -> None:
        with self._lock:
            self._watch.setdefault(module, []).append((hook, owner))
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def unwatch(self, module: str, hook: Callable[[ModuleType], None]) -> None:
        with self._lock:
            hooks = [h for h in self._watch.get(module, []) if h[0] is not hook]
            if hooks:
                self._watch[module] = hooks
            else:
                self._watch.pop(module, None)
            if not self._watch and self in sys.meta_path:
                sys.meta_path.remove(self)

    def fire(self, module_name: str, module: ModuleType) -> None:
        with self._lock:
            hooks = self._watch.pop(module_name, [])
            if not self._watch and self in sys.meta_path:
                sys.meta_path.remove(self)
        for hook, owner in hooks:
            owner._fired(module_name)
            hook(module)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._watch or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.name = None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_FINDER = _PostImportFinder()
