"""vLLM's ``ExampleHiddenStatesConnector`` writes through CUDA streams, events and pinned
memory unconditionally (its asynchronous writer), so on vLLM's CPU build a request gets a
path back while only ``<path>.lock`` is ever written, and the worker dies: 0.26's
``_StreamPlaceholder`` has no ``wait_event``, 0.22 raises a CUDA driver error, 0.32 a
``pin_memory`` error under a CPU torch.

On the CPU platform the connector module's ``torch`` becomes a view whose CUDA stream,
event and stream context are synchronous stand-ins and whose ``empty_like`` ignores
``pin_memory``: every copy is a plain CPU copy finished when it returns, so the writer
thread, the lock file and ``get_finished`` keep their upstream logic. Selected only where
vLLM's platform is the CPU (on CUDA it is not needed and not listed as applied); the hook
checks the platform again when the module loads, for a process that could not tell earlier.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import HIDDEN_STATES_CONNECTOR, module_source
from ...versions import spec
from ...wrappers import Proxy

ID = "vllm.hidden_states_connector_cpu_writer"
CONNECTOR = HIDDEN_STATES_CONNECTOR
# What the asynchronous writer uses that a machine without CUDA cannot give it.
CUDA_USES = ("torch.cuda.Stream()", "torch.cuda.Event()", "pin_memory=True")


class CpuStream:
    """``torch.cuda.Stream`` where every copy is synchronous: nothing to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CpuEvent:
    """``torch.cuda.Event`` for work that finished when it was issued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Cuda(Proxy):
    Stream = CpuStream
    Event = CpuEvent

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class CpuTorch(Proxy):
    """The connector module's ``torch`` on the CPU platform."""

    def __init__(self, torch: ModuleType) -> None:
        super().__init__(torch)
        object.__setattr__(self, "cuda", _Cuda(torch.cuda))

    def empty_like(self, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return self.inner.empty_like(*args, **kwargs)

    def empty(self, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return self.inner.empty(*args, **kwargs)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _probe() -> str | None:
    source = module_source(CONNECTOR)
    if source is None:
        return f"{CONNECTOR} is not installed"
    missing = [use for use in CUDA_USES if use not in source]
    if len(missing) == len(CUDA_USES):
        return f"{CONNECTOR} uses none of {', '.join(CUDA_USES)}: no CUDA-only writer"
    return None


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        if _on_cpu():
            patcher.wrap(module, "torch", CpuTorch)

    patcher.on_import(CONNECTOR, on_connector)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM's CPU build, ExampleHiddenStatesConnector writes its files synchronously",
    why="on the CPU build the connector's writer needs CUDA streams, events and pinned memory: "
    "the client gets a path, only <path>.lock is written, and the worker dies",
    how="on the CPU platform, the connector module's torch is a view with synchronous "
    "stand-ins for torch.cuda.Stream/Event/stream and empty_like without pin_memory",
    upstream="vLLM 0.22.0: ExampleHiddenStatesConnector copies device-to-host on a CUDA "
    "stream into pinned memory and writes from a thread pool",
    upstream_ref="none found: the asynchronous writer appears in the 0.22.0 wheel's "
    "example_hidden_states_connector.py (vLLM PR #43805 per vLLM PR #46301's description)",
    vllm=spec(">=0.22.0"),
    speculators=None,
    side=Side.WORKER,
    platform="cpu",
    probe=_probe,
    patch=_patch,
    remove_when="vLLM's connector writes without CUDA on the CPU platform",
)
