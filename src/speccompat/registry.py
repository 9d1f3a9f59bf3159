"""Selection of the catalogued adapters, and the per-process applied state.

The record is ``record.Adapter``, the report ``outcomes.Report``, the catalogue each wing's
(``inprocess.adapters.ADAPTERS``, then ``server.adapters.ADAPTERS``). Selection: an adapter's
specifiers say *when* it should apply; its probe confirms the upstream code looks as
expected. When the two disagree the report says so, and ``strict=True`` raises.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import matrix, targets
from .errors import (
    AdapterError,
    SpeccompatWarning,
    UnsupportedVersionError,
    V1RunnerRemovedError,
    VllmNotInstalledError,
)
from .inprocess.adapters import ADAPTERS as IN_PROCESS_ADAPTERS
from .outcomes import Outcome, Report, State
from .patching import APPLIED, Patcher
from .record import Adapter, ExtractionPath, Side
from .server.adapters import ADAPTERS as SERVER_ADAPTERS
from .versions import Environment, detect

log = logging.getLogger("speccompat")

DISABLE_ENV = "SPECCOMPAT_DISABLE"
SKIP_ENV = "SPECCOMPAT_SKIP"
# How server_verdict ends the reason of a server-path adapter that the plugin will apply.
WILL_APPLY_IN_SERVE = "; applies inside vllm serve"
# How the parent's choice reaches vLLM's spawned processes (read by plugin.py).
ACTIVE_ENV = "SPECCOMPAT_ACTIVE"
# The V1 model runner, whose pieces speculators 0.3/0.4's generator builds itself. vLLM 0.34.0
# deleted it (with gpu_input_batch, cpu_model_runner, kv_connector_model_runner_mixin and
# v1/spec_decode/extract_hidden_states): Model Runner V2 (vllm/v1/worker/gpu/) is the only one.
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
# An in-process adapter's outcome where apply() refuses the path (doctor, vLLM's children).
V1_RUNNER_GONE = (f"{V1_RUNNER} is gone (vLLM 0.34.0 removed the V1 model runners): apply() "
                  "refuses the in-process path on this vLLM")


class _Applied:
    """Per-process state: which adapters are patched, through which Patcher."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.patchers: dict[str, Patcher] = APPLIED  # patching's: adapters read it there
        # Server-path ids among them: the plugin applies those in each process on its own.
        self.server: set[str] = set()
        self.last: Report | None = None


_STATE = _Applied()


def catalogues() -> dict[ExtractionPath, tuple[Adapter, ...]]:
    """Each wing's ordered catalogue: the package an adapter lives in says its path."""
    return {ExtractionPath.IN_PROCESS: IN_PROCESS_ADAPTERS, ExtractionPath.SERVER: SERVER_ADAPTERS}


def catalogue() -> tuple[Adapter, ...]:
    """Every adapter record, in the order ``apply()`` patches them (in-process, then server)."""
    return tuple(a for adapters in catalogues().values() for a in adapters)


def wing_of(adapter: Adapter) -> ExtractionPath:
    """The path ``adapter`` serves: the wing whose catalogue holds it (a record in neither,
    such as a test's, is in-process: what the user's ``apply()`` serves)."""
    for path, adapters in catalogues().items():
        if any(a is adapter for a in adapters):
            return path
    return ExtractionPath.IN_PROCESS


def active() -> tuple[str, ...]:
    """Ids of the adapters patched in this process."""
    with _STATE.lock:
        return tuple(_STATE.patchers)


def apply(
    *,
    strict: bool = False,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> Report:
    """Select the adapters for the installed versions and patch them; idempotent.

    ``only``/``exclude`` take adapter ids; ``strict=True`` raises a typed error instead of
    logging and continuing. Serves the in-process generator: the plugin applies the server
    path's adapters inside ``vllm serve``. On a vLLM without the V1 model runner (0.34.0 on)
    it raises ``V1RunnerRemovedError`` before patching anything, also with ``strict=False``.
    """
    return _apply(strict=strict, only=only, exclude=exclude)


def _apply(
    *,
    strict: bool = False,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    sides: Sequence[Side] = (Side.DRIVER, Side.WORKER, Side.BOTH),
    adapters: Sequence[Adapter] | None = None,
    environment: Environment | None = None,
    judge_support: bool = True,
    paths: Sequence[ExtractionPath] = (ExtractionPath.IN_PROCESS,),
) -> Report:
    """``apply`` with the knobs of the plugin, ``doctor`` and the tests, kept out of the
    public signature. ``sides`` limits the process side; ``adapters``/``environment``
    replace the catalogue and the detected versions (tests, doctor); ``judge_support=False``
    skips the matrix verdict (vLLM's child processes, whose parent already judged).
    ``paths``: which extraction system's adapters (the plugin passes the server path).
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
        if disabled():
            outcomes = [
                Outcome(a.id, State.APPLIED, f"applied before {DISABLE_ENV}=1 was set", a.side)
                if a.id in _STATE.patchers
                else Outcome(a.id, State.SKIPPED, f"{DISABLE_ENV}=1", a.side)
                for a in pool
            ]
            return _remember(Report(env, support, tuple(outcomes)))
        refusal = in_process_refusal(env) if ExtractionPath.IN_PROCESS in paths else None
        if judge_support:
            if refusal is not None:
                raise refusal  # before anything is patched, strict or not
            _judge_support(env, support, strict)
        skip = exclude_ids | _split(os.environ.get(SKIP_ENV, ""))
        try:
            outcomes = [_apply_one(a, env, strict, only_ids, skip, sides, paths,
                                   refused=refusal is not None) for a in pool]
        finally:
            _publish_active()  # also when strict raised part-way: children follow this process
        return _remember(Report(env, support, tuple(outcomes)))


def revert() -> None:
    """Undo every patch of this process, restoring the identical original objects."""
    with _STATE.lock:
        for adapter_id in reversed(list(_STATE.patchers)):
            _STATE.patchers.pop(adapter_id).revert()
            _STATE.server.discard(adapter_id)
        _publish_active()
        _STATE.last = None


def report() -> Report:
    """The report of the last ``apply()`` in this process, or what it would do now."""
    with _STATE.lock:
        if _STATE.last is not None:
            return _STATE.last
    env = detect()
    support = matrix.check(env)
    refused = in_process_refusal(env) is not None
    outcomes = []
    for adapter in catalogue():
        if refused and wing_of(adapter) is ExtractionPath.IN_PROCESS:
            outcomes.append(Outcome(adapter.id, State.UNSUPPORTED, V1_RUNNER_GONE, adapter.side))
            continue
        verdict = select(adapter, env, probe=False)
        state = State.NOT_NEEDED if not verdict.wanted else State.SKIPPED
        reason = (verdict.why if not verdict.wanted
                  else f"{verdict.why}; apply() has not been called")
        outcomes.append(Outcome(adapter.id, state, reason, adapter.side))
    return Report(env, support, tuple(outcomes))


def server_verdict(environment: Environment | None = None) -> tuple[Outcome, ...]:
    """What the plugin would do inside ``vllm serve`` with ``extract_hidden_states``, per
    server-path adapter, judged here without patching: not needed (and why), or would apply
    (its probe confirms the code it expects), or failed (the probe found something else)."""
    env = environment or detect()
    outcomes = []
    for adapter in catalogues()[ExtractionPath.SERVER]:
        verdict = select(adapter, env, probe=True)
        if env.vllm is None:
            state, reason = State.UNSUPPORTED, verdict.why
        elif not verdict.wanted:
            state, reason = State.NOT_NEEDED, verdict.why
        elif verdict.mismatch is not None:
            state, reason = State.FAILED, f"{verdict.why}, but the probe found: {verdict.mismatch}"
        else:
            state, reason = State.SKIPPED, f"{verdict.why}{WILL_APPLY_IN_SERVE}"
        outcomes.append(Outcome(adapter.id, state, reason, adapter.side))
    return tuple(outcomes)


@dataclass(frozen=True)
class Verdict:
    """``select``'s answer: whether the installed versions are ones the adapter is for and
    why (not), and, where probed, what the probe found instead of the expected code."""

    wanted: bool
    why: str
    mismatch: str | None = None
    # Not wanted because the platform is another one, whatever the versions say.
    off_platform: bool = False


def select(adapter: Adapter, env: Environment, *, probe: bool) -> Verdict:
    """The one selection rule, for ``apply``, ``report`` and ``server_verdict``: the
    specifiers say when the adapter should apply; ``probe`` (side-effect free, yet it reads
    sources) confirms the code looks as expected, only where it is wanted."""
    wanted, why = adapter.wants(env)
    elsewhere = adapter.off_platform(env) if wanted else None
    if elsewhere is not None:
        return Verdict(False, elsewhere, off_platform=True)
    mismatch = _probe(adapter) if probe and wanted and env.vllm is not None else None
    return Verdict(wanted, why, mismatch)


def _apply_one(
    adapter: Adapter,
    env: Environment,
    strict: bool,
    only: set[str] | None,
    skip: set[str],
    sides: Sequence[Side],
    paths: Sequence[ExtractionPath] = (ExtractionPath.IN_PROCESS,),
    *,
    refused: bool = False,
) -> Outcome:
    def outcome(state: State, reason: str) -> Outcome:
        return Outcome(adapter.id, state, reason, adapter.side)

    if adapter.id in _STATE.patchers:
        return outcome(State.APPLIED, "already applied in this process")
    if only is not None and adapter.id not in only:
        return outcome(State.SKIPPED, "not in only=")
    if adapter.id in skip:
        return outcome(State.SKIPPED, f"excluded (exclude= or {SKIP_ENV})")
    path = wing_of(adapter)
    if path not in paths:
        if path is ExtractionPath.SERVER:
            return outcome(State.SKIPPED, "server-path adapter: the plugin applies it inside "
                           "vllm serve when the engine is asked for extract_hidden_states")
        return outcome(State.SKIPPED, f"{path.value}-path adapter, not for this process")
    if adapter.side not in sides:
        return outcome(State.SKIPPED, f"{adapter.side.value}-side adapter, not for this process")
    if refused and path is ExtractionPath.IN_PROCESS:
        return outcome(State.UNSUPPORTED, V1_RUNNER_GONE)
    verdict = select(adapter, env, probe=True)
    why, mismatch = verdict.why, verdict.mismatch
    if env.vllm is None:
        return outcome(State.UNSUPPORTED, why)
    if not verdict.wanted:
        # A vLLM-only adapter outside its range should find the old shape; if it
        # finds the new one, the version says one thing and the code another.
        if not verdict.off_platform and adapter.speculators is None and _probe(adapter) is None:
            _disagree(adapter, f"{why}, yet the installed code has the shape it fixes", strict)
        return outcome(State.NOT_NEEDED, why)
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
        return outcome(State.FAILED, f"patch failed: {exc!r}")
    _STATE.patchers[adapter.id] = patcher
    if path is ExtractionPath.SERVER:
        _STATE.server.add(adapter.id)
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
    _warn(f"adapter {adapter.id}: {message}")


def in_process_refusal(env: Environment) -> V1RunnerRemovedError | None:
    """Why ``apply()`` refuses the in-process path here, or ``None``: the installed vLLM (its
    metadata and its package) has no V1 model runner, which speculators 0.3/0.4's generator
    builds pieces of itself. Decided by reading the installed files (nothing is imported), not
    by the version number: vLLM 0.34.0 is where the runner went."""
    if env.vllm is None or targets.module_source("vllm") is None:
        return None
    if targets.module_source(V1_RUNNER) is not None:
        return None
    with_speculators = ("" if env.speculators is None
                        else f" with speculators {env.speculators.version}")
    return V1RunnerRemovedError(
        f"vLLM {env.vllm.raw}{with_speculators}, whose {V1_RUNNER} is gone (vLLM 0.34.0 "
        "removed the V1 model runners; Model Runner V2 is the only runner)",
        "speculators 0.3/0.4's in-process generator (VllmHiddenStatesGenerator, what "
        "speccompat.apply() serves) on vLLM up to 0.33.x, the last release with the V1 runner",
        "Nothing was patched. Stay on vLLM 0.33.x for speculators 0.3/0.4 (pip install "
        f"'{env.vllm.distribution}<0.34'), or move to speculators >= 0.5's server path: "
        "`vllm serve` with `extract_hidden_states`, which speccompat supports on vLLM 0.34 "
        "(its plugin applies inside vllm serve; no apply() call is needed).")


def _judge_support(env: Environment, support: matrix.Support, strict: bool) -> None:
    if env.vllm is None:
        if strict:
            raise VllmNotInstalledError()
        log.warning("vLLM is not installed; nothing to adapt")
        return
    if support.supported:
        return
    if strict:
        raise UnsupportedVersionError(support.found, support.supported_text, support.advice)
    _warn(support.message)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _warn(message: str) -> None:
    """A ``SpeccompatWarning`` attributed to the first caller outside speccompat: the
    line that called ``speccompat.apply()``, however deep inside the package it is raised."""
    frame = sys._getframe(0)
    level = 1  # stacklevel 1 is this function's own frame
    while frame.f_back is not None and os.path.abspath(
            frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    warnings.warn(message, SpeccompatWarning, stacklevel=level)


def _publish_active() -> None:
    """Hand the parent's choice to vLLM's processes through the environment they inherit
    (in-process adapters: the server path's have their own switch, ``speccompat.server``)."""
    ids = [i for i in _STATE.patchers if i not in _STATE.server]
    if ids:
        os.environ[ACTIVE_ENV] = json.dumps(ids)
    else:
        os.environ.pop(ACTIVE_ENV, None)


def _remember(report: Report) -> Report:
    """Keep the report and log each outcome once: a failure as a warning, the rest as debug."""
    _STATE.last = report
    for o in report.outcomes:
        if o.state is State.FAILED:
            log.warning("adapter %s failed to apply: %s", o.adapter, o.reason)
        else:
            log.debug("adapter %s %s (%s)", o.adapter, o.state.value, o.reason)
    return report


def disabled() -> bool:
    """``SPECCOMPAT_DISABLE=1``: speccompat patches nothing in this process."""
    return _truthy(os.environ.get(DISABLE_ENV))


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _split(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}
