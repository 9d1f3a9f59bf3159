"""Wall-time tallies the benchmarks share: wrap a method so each call adds its time."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CallKey = Callable[[tuple[Any, ...], dict[str, Any]], str]


@dataclass
class Tally:
    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.calls[key] = self.calls.get(key, 0) + 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def time_method(owner: Any, name: str, tally: Tally, key: str | CallKey) -> None:
    """Replace ``owner.name`` with a wrapper that adds each call's wall time to ``tally``
    under ``key`` (or ``key(args, kwargs)``), exceptions included."""
    method = getattr(owner, name)

    @functools.wraps(method)
    def call(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*a, **k)
        finally:
            tally.add(key if isinstance(key, str) else key(a, k), time.perf_counter() - start)

    # Instances may guard attribute writes (speccompat's views do); classes take setattr.
    (setattr if isinstance(owner, type) else object.__setattr__)(owner, name, call)


GUARDS = "guards"


def time_guards(tally: Tally) -> None:
    """Every call of speccompat's capture guards, under ``GUARDS``: the executor view's
    bookkeeping of each step and the structure check of each batch."""
    from speccompat.inprocess import guards

    for name in ("observe_rpc", "observe_step", "check"):
        time_method(guards.CaptureExpectation, name, tally, GUARDS)
