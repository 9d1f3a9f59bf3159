"""plugin.py: what a vLLM child process applies, as handed down by its parent."""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

import speccompat
from speccompat import Adapter, Environment, plugin, registry
from speccompat.patching import Patcher
from speccompat.record import Side
from speccompat.registry import ACTIVE_ENV

if TYPE_CHECKING:
    from conftest import Target

MakeEnv = Callable[..., Environment]
MakeAdapter = Callable[..., Adapter]


def test_requested_reads_the_parents_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTIVE_ENV, json.dumps(["vllm.a", "vllm.b"]))
    assert plugin.requested() == ["vllm.a", "vllm.b"]


def test_requested_drops_what_is_not_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTIVE_ENV, json.dumps(["vllm.a", 3, None, {"x": 1}, "vllm.b"]))
    assert plugin.requested() == ["vllm.a", "vllm.b"]


def test_requested_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ACTIVE_ENV not in os.environ
    assert plugin.requested() == []
    monkeypatch.setenv(ACTIVE_ENV, "")
    assert plugin.requested() == []
    monkeypatch.setenv(ACTIVE_ENV, "[]")
    assert plugin.requested() == []


@pytest.mark.parametrize("raw", ["[", "vllm.a,vllm.b", "{'a': 1}", "['vllm.a']"])
def test_requested_malformed_json_warns_and_gives_nothing(
    raw: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(ACTIVE_ENV, raw)
    with caplog.at_level(logging.WARNING, logger="speccompat"):
        assert plugin.requested() == []
    assert f"ignoring malformed {ACTIVE_ENV}" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING


@pytest.mark.parametrize("raw", ["5", '"vllm.a"', '{"vllm.a": 1}', "null", "true"])
def test_requested_json_that_is_not_a_list_is_malformed(
    raw: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(ACTIVE_ENV, raw)
    with caplog.at_level(logging.WARNING, logger="speccompat"):
        assert plugin.requested() == []
    assert f"ignoring malformed {ACTIVE_ENV}" in caplog.text


def test_load_without_a_parent_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("plugin.load() applied adapters without being asked")

    monkeypatch.setattr(registry, "apply", forbidden)
    monkeypatch.setattr(registry, "catalogue", forbidden)
    plugin.load()
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ


def test_load_with_malformed_env_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTIVE_ENV, "not json")
    plugin.load()
    assert speccompat.active() == ()


def test_load_applies_the_requested_worker_side_adapters(
    target: Target, adapter_factory: MakeAdapter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def tagging(tag: str) -> Callable[[Patcher], None]:
        def patch(patcher: Patcher) -> None:
            patcher.wrap(target.module, "greet",
                         lambda original: lambda who: f"{tag}({original(who)})")
        return patch

    adapters = (
        adapter_factory("t.driver", patch=tagging("driver"), side=Side.DRIVER),
        adapter_factory("t.worker", patch=tagging("worker"), side=Side.WORKER),
        adapter_factory("t.both", patch=tagging("both"), side=Side.BOTH),
        adapter_factory("t.not_requested", patch=tagging("nope"), side=Side.WORKER),
    )
    monkeypatch.setattr(registry, "catalogue", lambda: adapters)
    # The child reads the versions itself (no vLLM here: the override stands in for it).
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.16.0")
    monkeypatch.setenv("SPECCOMPAT_SPECULATORS_VERSION", "0.3.0")
    monkeypatch.setenv(ACTIVE_ENV, json.dumps(["t.driver", "t.worker", "t.both",
                                               "t.from_a_newer_parent"]))
    plugin.load()
    assert speccompat.active() == ("t.worker", "t.both")
    assert target.module.greet("x") == "both(worker(hello x))"
    report = speccompat.report()
    assert report.state_of("t.driver") is speccompat.State.SKIPPED
    assert report.state_of("t.not_requested") is speccompat.State.SKIPPED
    # What this process applied is handed on to its own children.
    assert json.loads(os.environ[ACTIVE_ENV]) == ["t.worker", "t.both"]


def test_load_does_not_judge_support_again(
    target: Target, adapter_factory: MakeAdapter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = adapter_factory("t.worker", side=Side.WORKER)
    monkeypatch.setattr(registry, "catalogue", lambda: (adapter,))
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.99.0")  # not a matrix cell
    monkeypatch.setenv(ACTIVE_ENV, json.dumps(["t.worker"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plugin.load()
    assert speccompat.active() == ("t.worker",)


def test_load_with_only_unknown_ids_applies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.16.0")
    monkeypatch.setenv(ACTIVE_ENV, json.dumps(["t.gone"]))
    plugin.load()  # the real catalogue: nothing named t.gone, nothing applied, no error
    assert speccompat.active() == ()
