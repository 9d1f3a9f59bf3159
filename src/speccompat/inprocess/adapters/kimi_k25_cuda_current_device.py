"""vLLM 0.15.x builds Kimi-K2.5 on ``torch.cuda.current_device()``
(``KimiK25ForConditionalGeneration.__init__`` moves its vision tower there), which raises
on vLLM's CPU builds ("Found no NVIDIA driver"), so the model never loads in the worker.

vLLM 0.16.0 asks the platform instead (``current_platform.current_device()``, PR #33320).
Kimi's module gets the same answer: its ``torch.cuda.current_device`` is the platform's,
which on CUDA is ``torch.cuda.current_device`` itself, and ``"cpu"`` on the CPU build.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import require_in_source
from ...versions import spec
from ...wrappers import Proxy

ID = "vllm.kimi_k25_cuda_current_device"
KIMI_K25 = "vllm.model_executor.models.kimi_k25"
RAW_LINE = "self.device = torch.cuda.current_device()"


def platform_current_device() -> Any:
    """What vLLM 0.16.0's Kimi-K2.5 asks: the current platform's device."""
    from vllm.platforms import current_platform

    return current_platform.current_device()


class _Cuda(Proxy):
    def current_device(self) -> Any:
        return platform_current_device()


class _Torch(Proxy):
    """Kimi's ``torch``: the real module, with ``cuda.current_device`` the platform's."""

    def __init__(self, torch: ModuleType) -> None:
        super().__init__(torch)
        object.__setattr__(self, "cuda", _Cuda(torch.cuda))


def _probe() -> str | None:
    return require_in_source(KIMI_K25, RAW_LINE)


def _patch(patcher: Patcher) -> None:
    # Kimi's module looks up its own global ``torch``; the real torch.cuda stays untouched.
    patcher.wrap_on_import(KIMI_K25, "torch", _Torch)


ADAPTER = Adapter(
    id=ID,
    summary="Kimi-K2.5's torch.cuda.current_device() is the platform's current device, so "
    "the model loads on vLLM CPU builds",
    why="without it KimiK25ForConditionalGeneration raises in __init__ on a machine without CUDA; "
    "on CUDA the answer is the same call",
    how="gives vLLM's kimi_k25 module a torch whose cuda.current_device() is "
    "current_platform.current_device()",
    upstream="vLLM 0.16.0: KimiK25ForConditionalGeneration uses "
    "current_platform.current_device() (PR #33320)",
    upstream_ref="vLLM PR #33320 \"[Kimi-K2.5] Replace torch.cuda with current_platform\" "
    "(backport, in 0.16.0)",
    vllm=spec(">=0.15.0,<0.16.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.15.x is no longer supported",
)
