"""What adapters install in the consumer's namespace in place of a real object or class.

- :class:`Proxy`: a view of a real object that overrides what the consumer must see and
  forwards everything else, ``__class__`` included (``isinstance(view, Real)`` holds).
- :func:`stand_in`: a class in place of a real class that builds the real object its own
  way (:func:`wrap_factory`: as a view; :func:`with_defaults`: with arguments the consumer
  does not pass). ``isinstance``, ``issubclass`` and the class attributes read through the
  consumer's name behave as they did before the patch.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

_BUILD = "__speccompat_build__"
_CHECKING = threading.local()


class Proxy:
    """Forwards every attribute to ``target``; subclasses override what the consumer must see.

    Used where vLLM's own callers rely on the real object's behaviour, so the
    consumer gets a normalized view while vLLM keeps the original. ``__class__`` is the
    real object's, so ``isinstance(view, type(real))`` holds as it does for the real one
    (``type(view)`` is still the view's own class).
    """

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_target"), name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        target: Any = object.__getattribute__(self, "_target")
        return target.__class__  # type: ignore[no-any-return]

    @property
    def inner(self) -> Any:
        """The next object down: another view, or the real one. Calls go here so views compose."""
        return object.__getattribute__(self, "_target")

    @property
    def unwrapped(self) -> Any:
        target = object.__getattribute__(self, "_target")
        return target.unwrapped if isinstance(target, Proxy) else target


class _StandInMeta(type):
    """The metaclass of stand-ins, combined with the real class's own (``ABCMeta``, ...).

    Only the stand-in itself behaves specially; a class a consumer derives from it is an
    ordinary subclass of the real class.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        build = cls.__dict__.get(_BUILD)
        if build is None:
            return super().__call__(*args, **kwargs)
        return build(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        if _BUILD in cls.__dict__:
            return isinstance(instance, cls.__dict__["__wrapped__"])
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        if _BUILD not in cls.__dict__:
            return super().__subclasscheck__(subclass)
        # ABCMeta answers for the real class by asking its subclasses, this one among
        # them: asked back, a stand-in adds no subclass of its own.
        asking: set[tuple[int, int]] = _CHECKING.__dict__.setdefault("asking", set())
        key = (id(cls), id(subclass))
        if key in asking:
            return False
        asking.add(key)
        try:
            return issubclass(subclass, cls.__dict__["__wrapped__"])
        finally:
            asking.discard(key)


_METACLASSES: dict[type, type] = {type: _StandInMeta}


def _metaclass_for(original: type) -> type:
    meta = type(original)
    if issubclass(meta, _StandInMeta):  # a stand-in of a stand-in
        return meta
    if meta not in _METACLASSES:
        _METACLASSES[meta] = type(f"_StandIn{meta.__name__}", (_StandInMeta, meta), {})
    return _METACLASSES[meta]


def stand_in(original: type, build: Callable[..., Any]) -> type:
    """A class to put where the consumer looks ``original`` up: calling it calls ``build``.

    It derives from ``original``, so its class attributes, methods and ``issubclass(it,
    Base)`` are the real class's; ``isinstance(obj, it)`` and ``issubclass(cls, it)`` are
    answered by ``original`` (what ``build`` returns is an instance of the real class, or a
    :class:`Proxy` of one). Class attributes assigned through it stay on it.
    """
    namespace = {
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
        "__wrapped__": original,
        _BUILD: build,
    }
    made: type = _metaclass_for(original)(original.__name__, (original,), namespace)
    return made


def _looks_like(call: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    call.__name__ = getattr(original, "__name__", call.__name__)
    call.__qualname__ = getattr(original, "__qualname__", call.__name__)
    call.__doc__ = getattr(original, "__doc__", None)
    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


def wrap_factory(
    original: Callable[..., Any], view: Callable[[Any], Any]
) -> Callable[..., Any]:
    """A stand-in for a class the consumer instantiates: builds the real object, returns a view."""

    def build(*args: Any, **kwargs: Any) -> Any:
        return view(original(*args, **kwargs))

    if isinstance(original, type):
        return stand_in(original, build)
    return _looks_like(build, original)


def with_defaults(original: Callable[..., Any], **defaults: Any) -> Callable[..., Any]:
    """``original`` with defaults for arguments the consumer does not pass (new required ones).

    A callable default is computed from the arguments that were passed, by name. A class
    stays a class (:func:`stand_in`).
    """
    signature = inspect.signature(original)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            passed = dict(signature.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            passed = dict(kwargs)
        for key, value in defaults.items():
            if key not in passed:
                kwargs[key] = value(passed) if callable(value) else value
        return original(*args, **kwargs)

    if isinstance(original, type):
        return stand_in(original, call)
    return _looks_like(call, original)
