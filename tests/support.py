"""Helpers the test modules import (conftest modules cannot be imported by name)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


requires_vllm = pytest.mark.skipif(not _installed("vllm"), reason="vLLM is not installed")
requires_speculators = pytest.mark.skipif(
    not _installed("speculators"), reason="speculators is not installed")


def gpu_count() -> int:
    """Visible CUDA devices, without initialising CUDA in this process (NVML)."""
    if not _installed("torch"):
        return 0
    import torch

    return int(torch.cuda.device_count())


requires_cuda = pytest.mark.skipif(gpu_count() == 0, reason="no CUDA device")


@contextlib.contextmanager
def speculators_generator(
    model: Path,
    *,
    apply: bool = True,
    exclude: tuple[str, ...] = (),
    **kwargs: Any,
) -> Iterator[Any]:
    """speculators' own VllmHiddenStatesGenerator, with speccompat applied (minus ``exclude``)."""
    import speccompat

    if apply:
        speccompat.apply(exclude=exclude)
    generator = None
    try:
        from speculators.data_generation import vllm_hidden_states_generator as module

        kwargs.setdefault("max_model_len", 1024)
        with _test_kernels(module):
            generator = module.VllmHiddenStatesGenerator(str(model), **kwargs)
        yield generator
    finally:
        if generator is not None and hasattr(generator, "executor"):
            executor = getattr(generator.executor, "unwrapped", generator.executor)
            contexts = _queue_contexts(executor)
            executor.shutdown()
            _close_zmq(contexts)
            del generator.executor, executor
        del generator
        gc.collect()
        speccompat.revert()


def _queue_contexts(executor: Any) -> list[Any]:
    """The zmq contexts behind an executor's message queues (sockets one level down)."""
    import zmq

    queues = [getattr(executor, "rpc_broadcast_mq", None),
              *(getattr(executor, "response_mqs", None) or [])]
    contexts = []
    for queue in filter(None, queues):
        for value in vars(queue).values():
            for obj in [value, *getattr(value, "__dict__", {}).values()]:
                if isinstance(obj, zmq.Socket) and obj.context not in contexts:
                    contexts.append(obj.context)
    return contexts


def _close_zmq(contexts: list[Any]) -> None:
    """Destroy an executor's message-queue contexts without lingering.

    After a worker failed, vLLM 0.22's executor shutdown leaves these contexts open with
    a message pending for the dead worker; terminating one at garbage collection blocks
    forever (seen in these tests). Linger 0 drops the message.
    """
    for context in contexts:
        if not context.closed:
            context.destroy(linger=0)


@contextlib.contextmanager
def _test_kernels(module: Any) -> Iterator[None]:
    """Test scaffolding for kernel choices of the test machines, not a speccompat adapter.

    The generator builds its own VllmConfig, so these are injected there:
    - CPU: vLLM's CPU ``rotary_embedding`` kernel reads the head count as
      ``query.size(-1) / head_size``, right only for 2-D queries; DeepSeek with MLA
      disabled (the only way it runs on CPU) passes 3-D ones and every token comes
      out wrong, so the native rotary op is chosen.
    - CUDA: the FlashInfer CUTLASS MoE backend that vLLM picks for DeepSeek did not
      finish starting on the test host (its kernels are not shipped), so Triton's.
    """
    import torch

    extra: dict[str, Any] = {}
    if not torch.cuda.is_available():
        from vllm.config import CompilationConfig

        extra["compilation_config"] = CompilationConfig(custom_ops=["all", "-rotary_embedding"])
    else:
        import vllm.config

        kernel_config = getattr(vllm.config, "KernelConfig", None)
        if kernel_config is not None and "moe_backend" in kernel_config.__dataclass_fields__:
            extra["kernel_config"] = kernel_config(moe_backend="triton")
    original = module.VllmConfig

    def config(*args: Any, **kwargs: Any) -> Any:
        for key, value in extra.items():
            kwargs.setdefault(key, value)
        return original(*args, **kwargs)

    module.VllmConfig = config
    try:
        yield
    finally:
        module.VllmConfig = original


@contextlib.contextmanager
def only(*adapter_ids: str) -> Iterator[None]:
    """Exactly these adapters applied for the block; the ids must exist in the catalogue."""
    import speccompat

    report = speccompat.apply(only=adapter_ids)
    try:
        for adapter_id in adapter_ids:
            assert report.state_of(adapter_id) is speccompat.State.APPLIED, report
        yield
    finally:
        speccompat.revert()


def make_request(request_id: str, length: int):  # type: ignore[no-untyped-def]
    """A request built the way speculators 0.3.0 builds it (no block hasher)."""
    import inspect

    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    extra = {"eos_token_id": 2} if "eos_token_id" in inspect.signature(Request).parameters else {}
    return Request(request_id=request_id, prompt_token_ids=list(range(10, 10 + length)),
                   sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
                   pooling_params=None, arrival_time=0.0, **extra)
