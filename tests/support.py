"""Helpers the test modules import (conftest modules cannot be imported by name)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import serving
from speccompat.inprocess import teardown


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


requires_vllm = pytest.mark.skipif(not _installed("vllm"), reason="vLLM is not installed")
requires_speculators = pytest.mark.skipif(
    not _installed("speculators"), reason="speculators is not installed")


# speculators 0.5.0 deleted the in-process generator: the server-path tests cover those.
requires_generator = pytest.mark.skipif(
    not serving.module_installed("speculators.data_generation.vllm_hidden_states_generator"),
    reason="the installed speculators has no in-process VllmHiddenStatesGenerator (removed "
           "in 0.5.0; the server path is tested by tests/e2e/server/)")


def contract_only_reason() -> str:
    """Why this run executes no model ("" when it does): the nox sessions set
    ``SPECCOMPAT_CONTRACT_ONLY=1`` with the cell's reason in ``SPECCOMPAT_CONTRACT_ONLY_WHY``
    (a release without a CPU build, or a CPU build whose compiled ops do not load here)."""
    if os.environ.get("SPECCOMPAT_CONTRACT_ONLY") != "1":
        return ""
    why = os.environ.get("SPECCOMPAT_CONTRACT_ONLY_WHY") or "SPECCOMPAT_CONTRACT_ONLY=1 is set"
    return f"contract-only cell: {why}; model execution not run"


# For tests that run a model without the model fixtures (in a subprocess of their own).
runs_models = pytest.mark.skipif(bool(contract_only_reason()), reason=contract_only_reason())


def adapter_applies(adapter_id: str) -> tuple[bool, str]:
    """Whether the catalogued adapter is for the installed vLLM and speculators (its
    specifiers against ``speccompat.detect()``, as ``apply()`` selects it), and why (not)."""
    import speccompat

    adapter = next((a for a in speccompat.catalogue() if a.id == adapter_id), None)
    if adapter is None:
        raise LookupError(f"no adapter {adapter_id} in the catalogue")
    return adapter.wants(speccompat.detect())


def needs_adapter(adapter_id: str, because: str = "") -> pytest.MarkDecorator:
    """Skip unless ``adapter_id`` applies here: its normalized and fails-without-it tests
    say nothing on versions it is not for. ``because``: what happens there instead."""
    import speccompat

    wanted, why = adapter_applies(adapter_id)
    adapter = next(a for a in speccompat.catalogue() if a.id == adapter_id)
    narrowed = adapter.speculators is not None and adapter.cause != "speculators"
    speculators = f", speculators {adapter.speculators}" if narrowed else ""
    reason = (f"adapter {adapter_id} is for {adapter.cause} {adapter.cause_specifier}"
              f"{speculators} ({why})"
              + (f": {because}" if because else ""))
    return pytest.mark.skipif(not wanted, reason=reason)


def vllm_in(specifier: str, because: str) -> pytest.MarkDecorator:
    """Skip unless the installed vLLM is in ``specifier``: for raw tests that pin what a
    range of vLLM releases does. ``because``: what the other releases do."""
    import speccompat
    from speccompat.versions import spec

    env = speccompat.detect()
    inside = env.vllm is not None and env.vllm.version in spec(specifier)
    found = env.vllm.version if env.vllm is not None else "not installed"
    return pytest.mark.skipif(not inside, reason=f"vLLM {found} is outside {specifier}: {because}")


def speculators_in(specifier: str, because: str) -> pytest.MarkDecorator:
    """Skip unless the installed speculators is in ``specifier``."""
    import speccompat
    from speccompat.versions import spec

    env = speccompat.detect()
    inside = env.speculators is not None and env.speculators.version in spec(specifier)
    found = env.speculators.version if env.speculators is not None else "not installed"
    return pytest.mark.skipif(
        not inside, reason=f"speculators {found} is outside {specifier}: {because}")


def scheduler_kwargs(vllm_config: Any) -> dict[str, Any]:
    """``block_size`` for ``Scheduler(...)`` where it takes one (vLLM 0.11.1+), the way
    vLLM's engine core passes it."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    if "block_size" in inspect.signature(Scheduler).parameters:
        return {"block_size": vllm_config.cache_config.block_size}
    return {}


def chunked_prefill_on(scheduler_config: Any) -> bool:
    """Whether the scheduler may cut a prompt across steps: ``chunked_prefill_enabled`` where
    the config has it (off in one built by hand on vLLM 0.11.0), else ``enable_chunked_prefill``
    (True by default from 0.12.0)."""
    if hasattr(scheduler_config, "chunked_prefill_enabled"):
        return bool(scheduler_config.chunked_prefill_enabled)
    return bool(scheduler_config.enable_chunked_prefill)


FRESH_PROCESS_ENV = "SPECCOMPAT_FRESH_PROCESS"


def run_python(*args: str, env: Mapping[str, str] | None = None, unset: Iterable[str] = (),
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python *args`` (``-c CODE ...`` or ``-m MODULE ...``) in a fresh interpreter, its
    output captured as text; its exit status is the caller's to check. The environment is
    this process's without speccompat's per-process switches (``SPECCOMPAT_ACTIVE``,
    ``SPECCOMPAT_DISABLE``, ``SPECCOMPAT_SKIP``: the child applies only what it is told)
    and without ``unset``, plus ``env``."""
    from speccompat import registry

    dropped = {registry.ACTIVE_ENV, registry.DISABLE_ENV, registry.SKIP_ENV, *unset}
    inherited = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run([sys.executable, *args], env={**inherited, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, check=False)


def _head_and_tail(text: str, head: int = 2000, tail: int = 5000) -> str:
    """A long failure's start (which test, where) and end (the exception itself)."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


def in_fresh_process(request: pytest.FixtureRequest) -> bool:
    """For a test that needs a process of its own: True in that process; elsewhere runs
    the test there (pytest on its node id), passes its skip or failure on, and returns
    False (the caller returns too)."""
    import re

    node = request.node.nodeid
    if os.environ.get(FRESH_PROCESS_ENV) == node:
        return True
    run = subprocess.run(
        [sys.executable, "-m", "pytest", node, "-p", "no:cacheprovider", "-q", "-rs"],
        cwd=request.config.rootpath, env={**os.environ, FRESH_PROCESS_ENV: node},
        capture_output=True, text=True, timeout=1200)
    output = run.stdout + run.stderr
    skipped = re.search(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", output, re.M)
    if run.returncode == 0 and skipped:
        pytest.skip(skipped.group(1))
    failures = output.find("= FAILURES =")  # the traceback, not the log lines after it
    assert run.returncode == 0 and " passed" in output, (
        _head_and_tail(output[failures:] if failures >= 0 else output))
    return False


def source_text(module: str, qualname: str) -> str:
    """``module``'s definition of ``qualname``, read from its file, not imported. Importing
    Kimi-K2.5's module imports numba, and after that vLLM 0.32's CPU worker cannot start
    in the same process (its kernel-override scan trips over llvmlite's library proxy):
    later contract tests start one."""
    from speccompat.targets import source_def

    found = source_def(module, qualname)
    assert found is not None, f"{module} defines no {qualname}"
    return found.text


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
            teardown.shut_down(getattr(generator.executor, "unwrapped", generator.executor))
            del generator.executor
        del generator
        gc.collect()
        speccompat.revert()


GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"


def import_generator_module() -> ModuleType:
    """speculators' generator module, imported as a user's ``apply()`` lets it import: where
    it cannot be imported without an adapter (speculators 0.4.0 on vLLM 0.11.0, transformers
    5, vLLM 0.33.0's moved helpers), only those adapters are applied for the import. A test
    that imports it itself must not rely on an earlier test having done so (``pytest -n``)."""
    import speccompat
    from speccompat.inprocess.adapters import (
        attn_mask_utils_removed,
        config_dtype_annotation,
        get_hash_fn_by_name_moved,
        kv_cache_planning_moved,
    )

    enabling = [m.ID for m in (get_hash_fn_by_name_moved, kv_cache_planning_moved,
                               config_dtype_annotation, attn_mask_utils_removed)
                if adapter_applies(m.ID)[0] and m.ADAPTER.probe() is None]
    if not enabling:
        return importlib.import_module(GENERATOR_MODULE)
    speccompat.apply(only=enabling)
    try:
        return importlib.import_module(GENERATOR_MODULE)
    finally:
        speccompat.revert()


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
    with constructor_kwargs(module, "VllmConfig", extra, override=False):
        yield


@contextlib.contextmanager
def constructor_kwargs(module: Any, name: str, values: dict[str, Any], *,
                       override: bool) -> Iterator[None]:
    """``module.<name>(...)`` gets ``values`` among its keyword arguments (replacing the
    caller's where ``override``): the generator builds its configs itself."""
    original = getattr(module, name)

    def build(*args: Any, **kwargs: Any) -> Any:
        kwargs = {**kwargs, **values} if override else {**values, **kwargs}
        return original(*args, **kwargs)

    setattr(module, name, build)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def fresh_shm_pool() -> Iterator[None]:
    """A fresh shared-memory slot pool for the block, closed after it (tests of
    ``speccompat.inprocess.shm`` and of the capture writing into its slots)."""
    from speccompat.inprocess import shm

    shm._POOL = None
    try:
        yield
    finally:
        gc.collect()
        if shm._POOL is not None:
            shm._POOL.close()
        shm._POOL = None


def extract_engine_config(model: Path, ids: Sequence[int] = (1, 4), **engine_args: Any) -> Any:
    """The VllmConfig ``vllm serve MODEL --speculative-config '{"method":
    "extract_hidden_states", ...}'`` builds (aux ``ids``; ``engine_args`` add to it), built
    with speccompat's plugin off (``SPECCOMPAT_DISABLE``) so this process stays raw."""
    from vllm.engine.arg_utils import EngineArgs

    from speccompat import registry

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(registry.DISABLE_ENV, "1")
        return EngineArgs(
            model=str(model), max_model_len=256, enforce_eager=True,
            speculative_config={
                "method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {
                    "hf_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}},
            },
            **engine_args,
        ).create_engine_config()


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


def worker_call(generator: Any, function: Any) -> list[Any]:
    """``function(worker)`` in each of a speculators generator's vLLM workers, one reply per
    rank. Define ``function`` inside the test: cloudpickle then sends it by value."""
    executor = getattr(generator.executor, "unwrapped", generator.executor)
    return list(executor.collective_rpc(function))


def import_fixes() -> list[str]:
    """The adapters without which speculators does not import here (transformers 5,
    vLLM 0.11.0 for speculators 0.4.0, vLLM 0.33.0's moved helpers): for tests that import
    it in this process without being about those adapters."""
    from speccompat.inprocess.adapters import (
        attn_mask_utils_removed,
        config_dtype_annotation,
        get_hash_fn_by_name_moved,
        kv_cache_planning_moved,
    )

    return [m.ID for m in (get_hash_fn_by_name_moved, kv_cache_planning_moved,
                           config_dtype_annotation, attn_mask_utils_removed)
            if adapter_applies(m.ID)[0] and m.ADAPTER.probe() is None]


def state_under_user_apply(adapter_id: str) -> Any:
    """What ``speccompat.apply()`` called by a user does with ``adapter_id`` (reverted after):
    SKIPPED for a server-path adapter, which only the plugin applies inside ``vllm serve``."""
    import speccompat

    report = speccompat.registry._apply(only=[adapter_id], judge_support=False)
    try:
        return report.state_of(adapter_id)
    finally:
        speccompat.revert()
