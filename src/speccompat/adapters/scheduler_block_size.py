"""``Scheduler.__init__`` requires ``block_size`` from vLLM 0.11.1.

speculators 0.3.0 does not pass it; the value vLLM's engine core passes is the
cache config's block size, which is what the generator's own config holds.
"""

from __future__ import annotations

from typing import Any

from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import GENERATOR, requires_argument, with_defaults
from ..versions import spec

ID = "vllm.scheduler.block_size_required"


def _block_size(kwargs: dict[str, Any]) -> int:
    return int(kwargs["vllm_config"].cache_config.block_size)


def _probe() -> str | None:
    from vllm.v1.core.sched.scheduler import Scheduler

    if not requires_argument(Scheduler.__init__, "block_size"):
        return "Scheduler.__init__ does not require block_size"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "Scheduler",
                           lambda original: with_defaults(original, block_size=_block_size))


ADAPTER = Adapter(
    id=ID,
    summary="Scheduler(...) built by speculators 0.3.0 gets block_size from the cache config",
    upstream="vLLM 0.11.1: Scheduler.__init__(..., block_size: int) is required",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 passes block_size)",
)
