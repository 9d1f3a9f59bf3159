"""server.py: when a vLLM process counts as serving extract_hidden_states, and the plugin's
server path (no vLLM needed: the frames and the command line are built here)."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from speccompat import plugin, registry, server
from speccompat.outcomes import State
from speccompat.record import ExtractionPath

EXTRACT = json.dumps({"method": "extract_hidden_states", "num_speculative_tokens": 1})
EAGLE = json.dumps({"method": "eagle3", "model": "draft"})


@pytest.fixture(autouse=True)
def _no_inherited_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server.SERVER_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["pytest"])


@pytest.mark.parametrize(("argv", "expected"), [
    (["vllm", "serve", "m", "--speculative-config", EXTRACT], True),
    (["api_server", f"--speculative-config={EXTRACT}"], True),
    (["api_server", "--speculative_config", EXTRACT], True),
    (["api_server", "-sc", EXTRACT], True),
    (["vllm", "serve", "m", "--speculative-config.method", "extract_hidden_states"], True),
    (["vllm", "serve", "m", "--speculative-config.method=extract_hidden_states"], True),
    (["vllm", "serve", "m", "--speculative-config", EAGLE], False),
    (["vllm", "serve", "m", "--speculative-config.method", "eagle3"], False),
    (["vllm", "serve", "m", "--speculative-config"], False),  # no value
    (["vllm", "serve", "m", "--speculative-config", "{not json"], False),
    (["vllm", "serve", "m", "--model", "extract_hidden_states"], False),
    (["vllm", "serve", "m"], False),
])
def test_command_line(argv: list[str], expected: bool) -> None:
    assert server.in_argv(argv) is expected


def test_engine_core_or_worker_frame_with_a_vllm_config() -> None:
    def engine_core(vllm_config: Any) -> bool:
        return server.in_frames(sys._getframe())

    extract = SimpleNamespace(speculative_config=SimpleNamespace(method="extract_hidden_states"))
    eagle = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle3"))
    plain = SimpleNamespace(speculative_config=None)
    assert engine_core(extract) is True
    assert engine_core(eagle) is False
    assert engine_core(plain) is False


def test_engine_args_frame() -> None:
    class AsyncEngineArgs:
        def __init__(self, speculative_config: Any) -> None:
            self.speculative_config = speculative_config

        def post_init(self) -> bool:
            return server.in_frames(sys._getframe())

    assert AsyncEngineArgs({"method": "extract_hidden_states"}).post_init() is True
    assert AsyncEngineArgs(EXTRACT).post_init() is True
    assert AsyncEngineArgs({"method": "eagle3"}).post_init() is False
    assert AsyncEngineArgs(None).post_init() is False


def test_a_frame_deeper_than_the_plugin_call_is_found() -> None:
    def vllm_caller(vllm_config: Any) -> bool:
        def load_general_plugins() -> bool:
            def entry_point() -> bool:
                return server.requested(sys._getframe())

            return entry_point()

        return load_general_plugins()

    config = SimpleNamespace(speculative_config=SimpleNamespace(method="extract_hidden_states"))
    assert vllm_caller(config) is True


def test_the_inherited_answer_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert server.requested(sys._getframe()) is False
    monkeypatch.setenv(server.SERVER_ENV, "1")
    assert server.requested(sys._getframe()) is True


# --------------------------------------------------------------------------- the plugin


@pytest.fixture
def server_adapter(adapter_factory: Any, env_factory: Any,
                   monkeypatch: pytest.MonkeyPatch) -> Any:
    """A synthetic server-path adapter as the only catalogue entry (the server wing's);
    vLLM 0.26.0 installed."""
    patched: list[str] = []

    def patch(patcher: Any) -> None:
        patched.append(patcher.adapter_id)

    adapter = adapter_factory("vllm.server_thing", patch=patch)
    monkeypatch.setattr(registry, "catalogues", lambda: {
        ExtractionPath.IN_PROCESS: (), ExtractionPath.SERVER: (adapter,)})
    monkeypatch.setattr(registry, "detect", lambda **_: env_factory("0.26.0", "0.9.0"))
    yield adapter, patched
    registry.revert()


def test_user_apply_leaves_server_adapters_to_the_plugin(server_adapter: Any) -> None:
    adapter, patched = server_adapter
    report = registry._apply(adapters=(adapter,), judge_support=False)
    assert report.state_of(adapter.id) is State.SKIPPED
    assert "plugin applies it inside vllm serve" in report.outcomes[0].reason
    assert patched == []


def test_plugin_applies_the_server_path_only_when_asked(
    server_adapter: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    adapter, patched = server_adapter
    plugin.load()  # pytest's own command line and frames: not a server
    assert patched == [] and not registry.active()
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "m", "--speculative-config", EXTRACT])
    with caplog.at_level(logging.INFO, logger=plugin.SERVER_LOG):
        plugin.load()
    assert patched == [adapter.id] and registry.active() == (adapter.id,)
    import os

    assert os.environ[server.SERVER_ENV] == "1"  # vLLM's children inherit the answer
    assert registry.ACTIVE_ENV not in os.environ  # the in-process hand-down stays empty
    lines = [r.getMessage() for r in caplog.records if r.name == plugin.SERVER_LOG]
    assert len(lines) == 1 and "server-path adapters applied: vllm.server_thing" in lines[0]


def test_plugin_does_nothing_when_disabled(
    server_adapter: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, patched = server_adapter
    monkeypatch.setenv(registry.DISABLE_ENV, "1")
    monkeypatch.setenv(server.SERVER_ENV, "1")
    plugin.load()
    assert patched == [] and not registry.active()
