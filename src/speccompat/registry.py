"""The adapter record, selection, the per-process applied state, and the report.

Selection: an adapter's specifiers say *when* it should apply; its probe
confirms the upstream code looks as expected. When the two disagree the report
says so, and ``strict=True`` raises.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet

from . import matrix
from .errors import AdapterError, SpeccompatWarning, UnsupportedVersionError, VllmNotInstalledError
from .patching import Patcher
from .versions import Environment, detect

log = logging.getLogger("speccompat")

DISABLE_ENV = "SPECCOMPAT_DISABLE"
SKIP_ENV = "SPECCOMPAT_SKIP"
# How the parent's choice reaches vLLM's spawned processes (read by plugin.py).
ACTIVE_ENV = "SPECCOMPAT_ACTIVE"


class Side(str, enum.Enum):
    """Which vLLM process an adapter patches."""

    DRIVER = "driver"  # the process that drives the executor (speculators' generator)
    WORKER = "worker"  # vLLM's worker processes (model forward, worker extensions)
    BOTH = "both"


class State(str, enum.Enum):
    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Adapter:
    """One upstream behaviour that speccompat normalizes.

    ``probe`` inspects the installed upstream code without changing it and
    returns ``None`` when it has the shape this adapter expects, or a sentence
    saying what it found instead. ``patch`` makes the change through the given
    ``Patcher``, which is what makes ``revert`` exact.

    Selection follows the cause: ``vllm`` is set for behaviours that came with a vLLM
    release, ``transformers`` for those that came with a transformers release (and then
    ``vllm`` stays ``None``: which vLLM a resolver pairs with that transformers is not the
    cause). ``speculators`` narrows either to the consumer it adapts.
    """

    id: str
    summary: str
    upstream: str
    vllm: SpecifierSet | None
    speculators: SpecifierSet | None
    side: Side
    probe: Callable[[], str | None]
    patch: Callable[[Patcher], None]
    remove_when: str
    why: str = ""
    # For behaviours that come with a transformers release rather than a vLLM one.
    transformers: SpecifierSet | None = None

    def __post_init__(self) -> None:
        if (self.vllm is None) == (self.transformers is None):
            raise ValueError(f"adapter {self.id}: select by exactly one causing package "
                             "(vllm= or transformers=)")

    @property
    def cause(self) -> str:
        """The package whose release brought the behaviour: the one that selects it."""
        return "vLLM" if self.vllm is not None else "transformers"

    @property
    def cause_specifier(self) -> SpecifierSet:
        selector = self.vllm if self.vllm is not None else self.transformers
        assert selector is not None  # __post_init__ guarantees one
        return selector

    def wants(self, env: Environment) -> tuple[bool, str]:
        """Whether the installed versions are ones this adapter is for, and why (not): the
        reason names the deciding package and its installed version."""
        if env.vllm is None:
            return False, "vLLM is not installed"
        if self.vllm is not None and env.vllm.version not in self.vllm:
            return False, f"vLLM {env.vllm.version} is outside {self.vllm}"
        if self.transformers is not None:
            if env.transformers is None:
                return False, "transformers is not installed"
            if env.transformers.version not in self.transformers:
                return False, (f"transformers {env.transformers.version} is outside "
                               f"{self.transformers}")
        if self.speculators is not None:
            if env.speculators is None:
                return False, "speculators is not installed"
            if env.speculators.version not in self.speculators:
                return False, f"speculators {env.speculators.version} is outside {self.speculators}"
        if self.transformers is not None:
            assert env.transformers is not None
            return True, f"transformers {env.transformers.version} is in {self.transformers}"
        return True, f"vLLM {env.vllm.version} is in {self.vllm}"


@dataclass(frozen=True)
class Outcome:
    adapter: str
    state: State
    reason: str
    side: Side

    def as_dict(self) -> dict[str, str]:
        return {"id": self.adapter, "state": self.state.value, "reason": self.reason,
                "side": self.side.value}


@dataclass(frozen=True)
class Report:
    """What ``apply()`` did, per adapter, and whether the installed pair is supported."""

    environment: Environment
    support: matrix.Support
    outcomes: tuple[Outcome, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.support.supported and not any(
            o.state in (State.FAILED, State.UNSUPPORTED) for o in self.outcomes
        )

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(o.adapter for o in self.outcomes if o.state is State.APPLIED)

    def state_of(self, adapter_id: str) -> State:
        for o in self.outcomes:
            if o.adapter == adapter_id:
                return o.state
        raise KeyError(adapter_id)

    def as_dict(self) -> dict[str, object]:
        return {
            "environment": self.environment.as_dict(),
            "supported": self.support.supported,
            "support": self.support.message,
            "ok": self.ok,
            "adapters": [o.as_dict() for o in self.outcomes],
        }

    def __str__(self) -> str:
        lines = [self.environment.describe(), self.support.message]
        width = max((len(o.adapter) for o in self.outcomes), default=0)
        lines += [f"  {o.adapter:<{width}}  {o.state.value:<11}  {o.reason}" for o in self.outcomes]
        return "\n".join(lines)


class _Applied:
    """Per-process state: which adapters are patched, through which Patcher."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.patchers: dict[str, Patcher] = {}
        self.last: Report | None = None


_STATE = _Applied()


def catalogue() -> tuple[Adapter, ...]:
    from .adapters import ADAPTERS

    return ADAPTERS


def active() -> tuple[str, ...]:
    """Ids of the adapters patched in this process."""
    with _STATE.lock:
        return tuple(_STATE.patchers)


def apply(
    *,
    strict: bool = False,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    sides: Sequence[Side] = (Side.DRIVER, Side.WORKER, Side.BOTH),
    adapters: Sequence[Adapter] | None = None,
    environment: Environment | None = None,
    judge_support: bool = True,
) -> Report:
    """Select the adapters for the installed versions and patch them; idempotent.

    ``only``/``exclude`` take adapter ids; ``sides`` limits the process side;
    ``adapters``/``environment`` replace the catalogue and the detected versions
    (tests); ``judge_support=False`` skips the matrix verdict (vLLM's child
    processes, whose parent already judged).
    """
    pool = catalogue() if adapters is None else tuple(adapters)
    only_ids = None if only is None else set(only)
    exclude_ids = set(exclude or ())
    unknown = (only_ids or set()) | exclude_ids
    unknown -= {a.id for a in pool}
    if unknown:
        raise AdapterError(", ".join(sorted(unknown)), "no such adapter")
    env = environment or detect()
    support = matrix.check(env)
    with _STATE.lock:
        if _truthy(os.environ.get(DISABLE_ENV)):
            outcomes = [
                Outcome(a.id, State.APPLIED, f"applied before {DISABLE_ENV}=1 was set", a.side)
                if a.id in _STATE.patchers
                else Outcome(a.id, State.SKIPPED, f"{DISABLE_ENV}=1", a.side)
                for a in pool
            ]
            return _remember(Report(env, support, tuple(outcomes)))
        if judge_support:
            _judge_support(env, support, strict)
        skip = exclude_ids | _split(os.environ.get(SKIP_ENV, ""))
        try:
            outcomes = [_apply_one(a, env, strict, only_ids, skip, sides) for a in pool]
        finally:
            _publish_active()  # also when strict raised part-way: children follow this process
        return _remember(Report(env, support, tuple(outcomes)))


def revert() -> None:
    """Undo every patch of this process, restoring the identical original objects."""
    with _STATE.lock:
        for adapter_id in reversed(list(_STATE.patchers)):
            _STATE.patchers.pop(adapter_id).revert()
        _publish_active()
        _STATE.last = None


def report() -> Report:
    """The report of the last ``apply()`` in this process, or what it would do now."""
    with _STATE.lock:
        if _STATE.last is not None:
            return _STATE.last
    env = detect()
    support = matrix.check(env)
    outcomes = []
    for adapter in catalogue():
        wanted, why = adapter.wants(env)
        state = State.NOT_NEEDED if not wanted else State.SKIPPED
        reason = why if not wanted else f"{why}; apply() has not been called"
        outcomes.append(Outcome(adapter.id, state, reason, adapter.side))
    return Report(env, support, tuple(outcomes))


def _apply_one(
    adapter: Adapter,
    env: Environment,
    strict: bool,
    only: set[str] | None,
    skip: set[str],
    sides: Sequence[Side],
) -> Outcome:
    def outcome(state: State, reason: str) -> Outcome:
        return Outcome(adapter.id, state, reason, adapter.side)

    if adapter.id in _STATE.patchers:
        return outcome(State.APPLIED, "already applied in this process")
    if only is not None and adapter.id not in only:
        return outcome(State.SKIPPED, "not in only=")
    if adapter.id in skip:
        return outcome(State.SKIPPED, f"excluded (exclude= or {SKIP_ENV})")
    if adapter.side not in sides:
        return outcome(State.SKIPPED, f"{adapter.side.value}-side adapter, not for this process")
    wanted, why = adapter.wants(env)
    if env.vllm is None:
        return outcome(State.UNSUPPORTED, why)
    if not wanted:
        # A vLLM-only adapter outside its range should find the old shape; if it
        # finds the new one, the version says one thing and the code another.
        if adapter.speculators is None and _probe(adapter) is None:
            _disagree(adapter, f"{why}, yet the installed code has the shape it fixes", strict)
        return outcome(State.NOT_NEEDED, why)
    mismatch = _probe(adapter)
    if mismatch is not None:
        _disagree(adapter, f"{why}, but the probe found: {mismatch}", strict)
        return outcome(State.FAILED, f"probe: {mismatch}")
    patcher = Patcher(adapter.id)
    try:
        adapter.patch(patcher)
    except Exception as exc:
        patcher.revert()
        if strict:
            raise AdapterError(adapter.id, f"patch failed: {exc!r}") from exc
        log.warning("speccompat: adapter %s failed to apply: %r", adapter.id, exc)
        return outcome(State.FAILED, f"patch failed: {exc!r}")
    _STATE.patchers[adapter.id] = patcher
    waiting = f"; patches {', '.join(patcher.waiting_for)} on import" if patcher.waiting_for else ""
    return outcome(State.APPLIED, f"{why}{waiting}")


def _probe(adapter: Adapter) -> str | None:
    try:
        return adapter.probe()
    except Exception as exc:
        return f"probe raised {exc!r}"


def _disagree(adapter: Adapter, message: str, strict: bool) -> None:
    if strict:
        raise AdapterError(adapter.id, message)
    warnings.warn(f"speccompat: adapter {adapter.id}: {message}", SpeccompatWarning, stacklevel=4)


def _judge_support(env: Environment, support: matrix.Support, strict: bool) -> None:
    if env.vllm is None:
        if strict:
            raise VllmNotInstalledError()
        log.warning("speccompat: vLLM is not installed; nothing to adapt")
        return
    if support.supported:
        return
    if strict:
        raise UnsupportedVersionError(support.found, support.supported_text, support.advice)
    warnings.warn(f"speccompat: {support.message}", SpeccompatWarning, stacklevel=4)


def _publish_active() -> None:
    """Hand the parent's choice to vLLM's processes through the environment they inherit."""
    ids = list(_STATE.patchers)
    if ids:
        os.environ[ACTIVE_ENV] = json.dumps(ids)
    else:
        os.environ.pop(ACTIVE_ENV, None)


def _remember(report: Report) -> Report:
    _STATE.last = report
    for o in report.outcomes:
        level = logging.WARNING if o.state is State.FAILED else logging.DEBUG
        log.log(level, "speccompat: %s %s (%s)", o.adapter, o.state.value, o.reason)
    return report


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _split(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}
