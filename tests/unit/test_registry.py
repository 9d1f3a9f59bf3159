"""registry.py: selection, switches, reports, errors; synthetic adapters only."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

import speccompat
from speccompat import (
    Adapter,
    AdapterError,
    Environment,
    SpeccompatWarning,
    State,
    UnsupportedVersionError,
    VllmNotInstalledError,
    registry,
)
from speccompat.patching import _FINDER, Patcher, patched_by
from speccompat.record import Side
from speccompat.registry import ACTIVE_ENV, DISABLE_ENV, SKIP_ENV

if TYPE_CHECKING:
    from conftest import Target

MakeEnv = Callable[..., Environment]
MakeAdapter = Callable[..., Adapter]


@contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


class Counter:
    """A patch function that records how often it ran and swaps ``module.greet``."""

    def __init__(self, target: Target, tag: str = "patched") -> None:
        self.target = target
        self.tag = tag
        self.calls = 0

    def __call__(self, patcher: Patcher) -> None:
        self.calls += 1
        tag = self.tag
        patcher.wrap(self.target.module, "greet",
                     lambda original: lambda who: f"{tag}: {original(who)}")


# --------------------------------------------------------------------------- selection


def test_applies_inside_its_range(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.in_range", patch=patch, vllm=">=0.11.1")
    env = env_factory("0.16.0", "0.3.0")
    with no_warnings():
        report = registry._apply(adapters=[adapter], environment=env)
    assert report.state_of("t.in_range") is State.APPLIED
    assert report.outcomes[0].reason == "vLLM 0.16.0 is in >=0.11.1"
    assert report.applied == ("t.in_range",)
    assert report.environment is env
    assert report.ok
    assert patch.calls == 1
    assert target.module.greet("x") == "patched: hello x"
    assert speccompat.active() == ("t.in_range",)


@pytest.mark.parametrize(("running", "wanted"), [("cpu", True), ("cuda", False)])
def test_a_platform_bound_adapter_follows_the_platform(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    running: str, wanted: bool,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.cpu_only", patch=patch, platform="cpu")
    env = dataclasses.replace(env_factory("0.26.0", "0.9.0"), platform=running)
    with no_warnings():
        report = registry._apply(adapters=[adapter], environment=env)
    assert report.state_of("t.cpu_only") is (State.APPLIED if wanted else State.NOT_NEEDED)
    assert patch.calls == (1 if wanted else 0)
    if not wanted:
        assert report.outcomes[0].reason == (
            "vLLM's platform here is cuda; the behaviour exists only on the cpu platform")


def test_without_a_known_platform_vllms_own_answer_decides(
    env_factory: MakeEnv, adapter_factory: MakeAdapter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In vLLM's processes the detected environment has no platform (a CUDA wheel is plain
    ``vllm``): the already-imported ``vllm.platforms`` answers; never an import of its own."""
    adapter = adapter_factory("t.cpu_only", platform="cpu")
    env = env_factory("0.26.0", "0.9.0")
    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    assert adapter.off_platform(env) is None  # unknown: selected, its hook checks again
    assert "vllm.platforms" not in sys.modules

    class Platform:
        device_name = "cuda"

        def __init__(self, cpu: bool = False, unspecified: bool = False) -> None:
            self.cpu, self.unspecified = cpu, unspecified

        def is_cpu(self) -> bool:
            return self.cpu

        def is_unspecified(self) -> bool:
            return self.unspecified

    platforms = types.ModuleType("vllm.platforms")
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    platforms._current_platform = None  # type: ignore[attr-defined]
    assert adapter.off_platform(env) is None  # not resolved yet: never resolved from here
    for current, wanted in [(Platform(), False), (Platform(cpu=True), True),
                            (Platform(unspecified=True), True)]:
        platforms._current_platform = current  # type: ignore[attr-defined]
        assert registry.select(adapter, env, probe=False).wanted is wanted


def test_dev_build_of_the_lower_bound_is_in_range(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.dev", patch=Counter(target), vllm=">=0.11.1")
    report = registry._apply(adapters=[adapter], environment=env_factory("0.11.1.dev123+gabc"),
                              judge_support=False)
    assert report.state_of("t.dev") is State.APPLIED


def test_not_needed_outside_its_vllm_range(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.old", patch=patch, vllm="<0.11.1",
                              probe=lambda: "the old shape is gone")
    with no_warnings():
        report = registry._apply(adapters=[adapter], environment=env_factory())
    outcome = report.outcomes[0]
    assert outcome.state is State.NOT_NEEDED
    assert outcome.reason == "vLLM 0.16.0 is outside <0.11.1"
    assert patch.calls == 0
    assert report.ok
    assert target.module.greet("x") == "hello x"


def test_not_needed_outside_its_speculators_range(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    probed: list[int] = []

    def probe() -> None:
        probed.append(1)

    adapter = adapter_factory("t.spec", patch=Counter(target), speculators="==0.3.*", probe=probe)
    with no_warnings():
        report = registry._apply(adapters=[adapter], environment=env_factory("0.16.0", "0.4.0"),
                                  judge_support=False)
    assert report.state_of("t.spec") is State.NOT_NEEDED
    assert report.outcomes[0].reason == "speculators 0.4.0 is outside ==0.3.*"
    # Speculators-bound adapters are not cross-checked by their probe.
    assert probed == []


def test_not_needed_without_speculators(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.spec", patch=Counter(target), speculators="==0.3.*")
    report = registry._apply(adapters=[adapter], environment=env_factory("0.16.0", None))
    assert report.state_of("t.spec") is State.NOT_NEEDED
    assert report.outcomes[0].reason == "speculators is not installed"


def test_speculators_in_range(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.spec", patch=Counter(target), speculators="==0.3.*")
    report = registry._apply(adapters=[adapter], environment=env_factory("0.16.0", "0.3.0"))
    assert report.state_of("t.spec") is State.APPLIED


def test_unsupported_without_vllm(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.any", patch=patch, vllm=">=0")
    with caplog.at_level(logging.WARNING, logger="speccompat"):
        report = registry._apply(adapters=[adapter], environment=env_factory(None, None))
    assert report.state_of("t.any") is State.UNSUPPORTED
    assert report.outcomes[0].reason == "vLLM is not installed"
    assert not report.ok
    assert not report.support.supported
    assert patch.calls == 0
    assert "vLLM is not installed" in caplog.text


def test_probe_mismatch_fails_and_warns(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.probe", patch=patch, probe=lambda: "Engine.step takes 3 args")
    with pytest.warns(SpeccompatWarning, match=r"t\.probe.*Engine\.step takes 3 args"):
        report = registry._apply(adapters=[adapter], environment=env_factory())
    outcome = report.outcomes[0]
    assert outcome.state is State.FAILED
    assert outcome.reason == "probe: Engine.step takes 3 args"
    assert not report.ok
    assert patch.calls == 0
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ


def test_probe_mismatch_strict_raises(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.probe", patch=patch, probe=lambda: "Engine.step takes 3 args")
    with pytest.raises(AdapterError, match=r"Engine\.step takes 3 args") as caught:
        registry._apply(adapters=[adapter], environment=env_factory(), strict=True)
    assert caught.value.adapter_id == "t.probe"
    assert "vLLM 0.16.0 is in >=0.11.1" in caught.value.reason
    assert patch.calls == 0
    assert speccompat.active() == ()


def test_probe_that_raises_is_a_mismatch(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    def probe() -> str | None:
        raise ImportError("No module named 'vllm'")

    adapter = adapter_factory("t.probe", patch=Counter(target), probe=probe)
    with pytest.warns(SpeccompatWarning, match="probe raised"):
        report = registry._apply(adapters=[adapter], environment=env_factory())
    assert report.state_of("t.probe") is State.FAILED
    assert report.outcomes[0].reason.startswith("probe: probe raised ImportError(")


def test_vllm_only_adapter_out_of_range_finding_the_new_shape_warns(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.early", patch=patch, vllm=">=0.17.0", probe=lambda: None)
    with pytest.warns(SpeccompatWarning, match="yet the installed code has the shape it fixes"):
        report = registry._apply(adapters=[adapter], environment=env_factory())
    assert report.state_of("t.early") is State.NOT_NEEDED
    assert patch.calls == 0
    with pytest.raises(AdapterError, match="shape it fixes"):
        registry._apply(adapters=[adapter], environment=env_factory(), strict=True)


def test_sides(target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter) -> None:
    worker = adapter_factory("t.worker", patch=Counter(target, "w"), side=Side.WORKER)
    driver = adapter_factory("t.driver", patch=Counter(target, "d"), side=Side.DRIVER)
    report = registry._apply(adapters=[worker, driver], environment=env_factory(),
                              sides=(Side.DRIVER,))
    assert report.state_of("t.worker") is State.SKIPPED
    assert report.outcomes[0].reason == "worker-side adapter, not for this process"
    assert report.outcomes[0].side is Side.WORKER
    assert report.state_of("t.driver") is State.APPLIED


# --------------------------------------------------------------------------- only / exclude


def _three(target: Target, adapter_factory: MakeAdapter) -> tuple[list[Adapter], list[Counter]]:
    counters = [Counter(target, tag) for tag in "abc"]
    adapters = [adapter_factory(f"t.{tag}", patch=c)
                for tag, c in zip("abc", counters, strict=True)]
    return adapters, counters


def test_only(target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter) -> None:
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory(), only=["t.b"])
    assert [o.state for o in report.outcomes] == [State.SKIPPED, State.APPLIED, State.SKIPPED]
    assert report.outcomes[0].reason == "not in only="
    assert [c.calls for c in counters] == [0, 1, 0]


def test_exclude(target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter) -> None:
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory(), exclude=["t.a"])
    assert [o.state for o in report.outcomes] == [State.SKIPPED, State.APPLIED, State.APPLIED]
    assert "exclude=" in report.outcomes[0].reason
    assert [c.calls for c in counters] == [0, 1, 1]


def test_exclude_accepts_any_iterable(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory(),
                              exclude=(i for i in ["t.a"]))
    assert report.state_of("t.a") is State.SKIPPED
    assert counters[0].calls == 0


def test_only_accepts_any_iterable(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory(),
                              only=(i for i in ["t.c"]))
    assert report.applied == ("t.c",)
    assert [c.calls for c in counters] == [0, 0, 1]


@pytest.mark.parametrize("kwarg", ["only", "exclude"])
def test_unknown_ids_raise_before_anything_is_patched(
    kwarg: str, target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapters, counters = _three(target, adapter_factory)
    ids = ["t.a", "t.nope", "t.zzz"]
    with pytest.raises(AdapterError, match="no such adapter") as caught:
        if kwarg == "only":
            registry._apply(adapters=adapters, environment=env_factory(), only=ids)
        else:
            registry._apply(adapters=adapters, environment=env_factory(), exclude=ids)
    assert caught.value.adapter_id == "t.nope, t.zzz"
    assert [c.calls for c in counters] == [0, 0, 0]
    assert speccompat.active() == ()


# --------------------------------------------------------------------------- env switches


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_disable_switch(
    value: str, target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DISABLE_ENV, value)
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory())
    assert [o.state for o in report.outcomes] == [State.SKIPPED] * 3
    assert {o.reason for o in report.outcomes} == {"SPECCOMPAT_DISABLE=1"}
    assert [c.calls for c in counters] == [0, 0, 0]
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ
    assert target.module.greet("x") == "hello x"


@pytest.mark.parametrize("value", ["0", "", "false", "no"])
def test_disable_switch_off(
    value: str, target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DISABLE_ENV, value)
    adapters, _ = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory())
    assert report.applied == ("t.a", "t.b", "t.c")


def test_skip_switch(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SKIP_ENV, "t.a, t.c,,")
    adapters, counters = _three(target, adapter_factory)
    report = registry._apply(adapters=adapters, environment=env_factory())
    assert [o.state for o in report.outcomes] == [State.SKIPPED, State.APPLIED, State.SKIPPED]
    assert SKIP_ENV in report.outcomes[0].reason
    assert [c.calls for c in counters] == [0, 1, 0]


# --------------------------------------------------------------------------- support verdict


def test_newer_vllm_warns_but_applies(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.a", patch=Counter(target))
    with pytest.warns(SpeccompatWarning, match="newer than any release"):
        report = registry._apply(adapters=[adapter], environment=env_factory("0.99.0"))
    assert report.state_of("t.a") is State.APPLIED
    assert not report.ok  # applied, but not proven on this release


# --------------------------------------------------------------------------- log and warnings


def test_warnings_point_at_the_line_that_called_apply(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    # Two warnings from two depths inside the package: the support verdict and a probe.
    adapter = adapter_factory("t.probe", patch=Counter(target), probe=lambda: "not the shape")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        registry._apply(adapters=[adapter], environment=env_factory("0.99.0"))
    assert len(caught) == 2, [str(w.message) for w in caught]
    for w in caught:
        assert issubclass(w.category, SpeccompatWarning)
        assert (w.filename, w.lineno) == (__file__, line), str(w.message)
        assert not str(w.message).startswith("speccompat:")


def test_log_messages_do_not_repeat_the_logger_name(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapters = [adapter_factory("t.ok", patch=Counter(target)),
                adapter_factory("t.half", patch=_half_patch(target))]
    with caplog.at_level(logging.DEBUG, logger="speccompat"):
        registry._apply(adapters=adapters, environment=env_factory())
        registry._apply(adapters=adapters, environment=env_factory(None, None))
    records = [r for r in caplog.records if r.name == "speccompat"]
    assert {"t.ok", "t.half"} <= {m for r in records for m in r.getMessage().split()}
    for record in records:
        assert not record.getMessage().lower().startswith("speccompat"), record.getMessage()


def test_unsupported_pair_strict_raises(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.a", patch=patch)
    with pytest.raises(UnsupportedVersionError) as caught:
        registry._apply(adapters=[adapter], environment=env_factory("0.10.2", "0.3.0"),
                         strict=True)
    assert "vLLM 0.10.2 with speculators 0.3.0" in caught.value.found
    assert "0.11.0 to 0.33.0" in caught.value.supported
    assert caught.value.advice
    assert patch.calls == 0


def test_no_vllm_strict_raises(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    with pytest.raises(VllmNotInstalledError, match="SPECCOMPAT_VLLM_VERSION"):
        registry._apply(adapters=[adapter_factory("t.a", patch=Counter(target))],
                         environment=env_factory(None), strict=True)


def test_judge_support_false_is_silent(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.a", patch=Counter(target))
    with no_warnings():
        report = registry._apply(adapters=[adapter], environment=env_factory("0.99.0"),
                                  judge_support=False)
    assert report.state_of("t.a") is State.APPLIED
    assert not report.support.supported  # the verdict is still in the report


# --------------------------------------------------------------------------- failing patches


def _half_patch(target: Target) -> Callable[[Patcher], None]:
    def patch(patcher: Patcher) -> None:
        patcher.replace(target.module, "greet", lambda who: "half")
        patcher.replace(target.Engine, "step", lambda self: "half")
        patcher.on_import("sc_unit_never_imported_module", lambda module: None)
        raise RuntimeError("boom")

    return patch


def test_failing_patch_is_reverted(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    greet, step = target.module.greet, target.Engine.__dict__["step"]
    adapter = adapter_factory("t.half", patch=_half_patch(target))
    with caplog.at_level(logging.WARNING, logger="speccompat"):
        report = registry._apply(adapters=[adapter], environment=env_factory())
    assert report.state_of("t.half") is State.FAILED
    assert report.outcomes[0].reason == "patch failed: RuntimeError('boom')"
    assert not report.ok
    assert target.module.greet is greet
    assert target.Engine.__dict__["step"] is step
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ
    assert "t.half failed to apply" in caplog.text
    failures = [r for r in caplog.records if "t.half" in r.getMessage()]
    assert len(failures) == 1, "a failed patch is logged once"
    assert failures[0].levelno == logging.WARNING
    assert _FINDER not in sys.meta_path


def test_failing_patch_strict_raises_and_reverts(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    greet = target.module.greet
    adapter = adapter_factory("t.half", patch=_half_patch(target))
    with pytest.raises(AdapterError, match="patch failed") as caught:
        registry._apply(adapters=[adapter], environment=env_factory(), strict=True)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert target.module.greet is greet
    assert speccompat.active() == ()


def test_one_failure_does_not_stop_the_others(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    bad = adapter_factory("t.bad", patch=_half_patch(target))
    good = adapter_factory("t.good", patch=Counter(target))
    report = registry._apply(adapters=[bad, good], environment=env_factory())
    assert [o.state for o in report.outcomes] == [State.FAILED, State.APPLIED]
    assert target.module.greet("x") == "patched: hello x"
    assert json.loads(os.environ[ACTIVE_ENV]) == ["t.good"]


def test_strict_failure_leaves_a_consistent_state(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    good = adapter_factory("t.good", patch=Counter(target))
    bad = adapter_factory("t.bad", probe=lambda: "mismatch")
    with pytest.raises(AdapterError):
        registry._apply(adapters=[good, bad], environment=env_factory(), strict=True)
    published = json.loads(os.environ.get(ACTIVE_ENV, "[]"))
    assert list(speccompat.active()) == published


# --------------------------------------------------------------------------- state and report


def test_apply_twice_is_idempotent(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.a", patch=patch)
    first = registry._apply(adapters=[adapter], environment=env_factory())
    second = registry._apply(adapters=[adapter], environment=env_factory())
    assert first.state_of("t.a") is second.state_of("t.a") is State.APPLIED
    assert second.outcomes[0].reason == "already applied in this process"
    assert patch.calls == 1
    assert target.module.greet("x") == "patched: hello x"


def test_active_env_is_published_and_withdrawn(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapters, _ = _three(target, adapter_factory)
    registry._apply(adapters=adapters, environment=env_factory(), exclude=["t.b"])
    assert json.loads(os.environ[ACTIVE_ENV]) == ["t.a", "t.c"]
    assert speccompat.active() == ("t.a", "t.c")
    speccompat.revert()
    assert ACTIVE_ENV not in os.environ
    assert speccompat.active() == ()
    assert target.module.greet("x") == "hello x"


def test_nothing_applied_publishes_nothing(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    adapter = adapter_factory("t.a", patch=Counter(target), vllm="<0.11",
                              probe=lambda: "old shape gone")
    registry._apply(adapters=[adapter], environment=env_factory())
    assert ACTIVE_ENV not in os.environ


def test_report_object(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    applied = adapter_factory("t.applied", patch=Counter(target))
    old = adapter_factory("t.old", vllm="<0.11", probe=lambda: "gone")
    report = registry._apply(adapters=[applied, old], environment=env_factory())
    data = report.as_dict()
    assert data["supported"] is True
    assert data["ok"] is True
    assert data["support"] == report.support.message
    assert data["environment"] == env_factory().as_dict()
    assert data["adapters"] == [
        {"id": "t.applied", "state": "applied", "reason": "vLLM 0.16.0 is in >=0.11.1",
         "side": "driver"},
        {"id": "t.old", "state": "not needed", "reason": "vLLM 0.16.0 is outside <0.11",
         "side": "driver"},
    ]
    json.dumps(data)  # serializable as is
    text = str(report)
    lines = text.splitlines()
    assert lines[0] == env_factory().describe()
    assert lines[1] == "vLLM 0.16.0 with speculators 0.3.0: supported"
    assert "t.applied" in lines[2] and "applied" in lines[2]
    assert "t.old" in lines[3] and "not needed" in lines[3]
    with pytest.raises(KeyError):
        report.state_of("t.missing")


@pytest.mark.usefixtures("no_vllm_installed")
def test_report_before_apply_lists_the_catalogue() -> None:
    report = speccompat.report()
    ids = [a.id for a in speccompat.catalogue()]
    assert ids, "the catalogue is empty"
    assert [o.adapter for o in report.outcomes] == ids
    # No vLLM in the unit venv: every adapter is "not needed", and nothing was patched.
    assert {o.state for o in report.outcomes} == {State.NOT_NEEDED}
    assert {o.reason for o in report.outcomes} == {"vLLM is not installed"}
    assert speccompat.active() == ()


def test_report_before_apply_with_versions_says_apply_was_not_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.16.0")
    monkeypatch.setenv("SPECCOMPAT_SPECULATORS_VERSION", "0.3.0")
    report = speccompat.report()
    assert report.support.supported
    wanted = [o for o in report.outcomes if o.state is State.SKIPPED]
    assert wanted, "no catalogued adapter is for vLLM 0.16.0 with speculators 0.3.0"
    assert all(o.reason.endswith("apply() has not been called") for o in wanted)
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ


def test_report_after_apply_and_after_revert(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    applied = registry._apply(adapters=[adapter_factory("t.a", patch=Counter(target))],
                               environment=env_factory())
    assert speccompat.report() is applied
    speccompat.revert()
    after = speccompat.report()
    assert after is not applied
    assert [o.adapter for o in after.outcomes] == [a.id for a in speccompat.catalogue()]


def test_revert_without_apply_is_harmless() -> None:
    speccompat.revert()
    speccompat.revert()
    assert speccompat.active() == ()


# --------------------------------------------------------------------------- threads


def test_concurrent_apply_patches_once(
    target: Target, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter(target)
    adapter = adapter_factory("t.threads", patch=patch)
    env = env_factory()
    barrier = threading.Barrier(16)
    reports: list[speccompat.Report] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait()
            result = registry._apply(adapters=[adapter], environment=env)
            with lock:
                reports.append(result)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(reports) == 16
    assert patch.calls == 1
    assert {r.state_of("t.threads") for r in reports} == {State.APPLIED}
    reasons = sorted(r.outcomes[0].reason for r in reports)
    assert reasons.count("already applied in this process") == 15
    before = target.calls["greet"]
    assert target.module.greet("x") == "patched: hello x"  # one layer, not sixteen
    assert target.calls["greet"] == before + 1
    assert patched_by(target.module.greet) == "t.threads"
    assert speccompat.active() == ("t.threads",)


def test_transformers_specifier_selects_too(
    env_factory: MakeEnv, adapter_factory: MakeAdapter, target: Target,
) -> None:
    from packaging.specifiers import SpecifierSet

    adapter = dataclasses.replace(adapter_factory("t.tf", patch=Counter(target)),
                                  vllm=None, transformers=SpecifierSet(">=5.24"))
    assert adapter.cause == "transformers"
    # Selected by the cause whatever vLLM it is paired with: old and new alike.
    for vllm in ("0.19.1", "0.22.0", "0.29.0"):
        wanted, why = adapter.wants(env_factory(vllm, "0.3.0", transformers="5.24.0"))
        assert wanted and why == "transformers 5.24.0 is in >=5.24", vllm
    wanted, why = adapter.wants(env_factory("0.29.0", "0.3.0", transformers="5.23.0"))
    assert not wanted and why == "transformers 5.23.0 is outside >=5.24"
    assert adapter.wants(env_factory("0.29.0", "0.3.0"))[1] == "transformers is not installed"
    assert adapter.wants(env_factory(None, "0.3.0", transformers="5.24.0"))[1] == (
        "vLLM is not installed")


def test_an_adapter_has_exactly_one_cause(
    adapter_factory: MakeAdapter, env_factory: MakeEnv,
) -> None:
    import dataclasses

    from packaging.specifiers import SpecifierSet

    adapter = adapter_factory("t.cause")
    assert adapter.cause == "vLLM" and adapter.cause_specifier == adapter.vllm
    with pytest.raises(ValueError, match="exactly one causing package"):
        dataclasses.replace(adapter, transformers=SpecifierSet(">=5"))
    with pytest.raises(ValueError, match="exactly one causing package"):
        dataclasses.replace(adapter, vllm=None, speculators=None)
    # speculators' own code: selected by the speculators release alone, on any vLLM.
    own = dataclasses.replace(adapter, vllm=None, speculators=SpecifierSet("==0.3.*"))
    assert own.cause == "speculators" and own.cause_specifier == own.speculators
    for vllm in ("0.11.0", "0.33.0"):
        assert own.wants(env_factory(vllm, "0.3.0")) == (True, "speculators 0.3.0 is in ==0.3.*")
    assert own.wants(env_factory("0.22.0", "0.4.0")) == (
        False, "speculators 0.4.0 is outside ==0.3.*")
