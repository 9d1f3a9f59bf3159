"""``Scheduler.__init__`` requires ``block_size`` from vLLM 0.11.1.

speculators 0.3.0 does not pass it; the value vLLM's engine core passes is the
cache config's block size, which is what the generator's own config holds.
speculators 0.4.0 passes it, which vLLM 0.11.0 rejects; there the scheduler
takes the block size from the cache config, so the argument is dropped when the
two agree (0.4.0 builds both from one constant).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, source_def
from ...versions import spec
from ...wrappers import with_defaults

ID = "vllm.scheduler_block_size"
ID_V04 = "vllm.scheduler_block_size.speculators_0_4"


def _block_size(kwargs: dict[str, Any]) -> int:
    return int(kwargs["vllm_config"].cache_config.block_size)


def _without_block_size(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original, updated=())  # a class: its __dict__ stays its own
    def build(*args: Any, **kwargs: Any) -> Any:
        block_size = kwargs.pop("block_size", None)
        config = kwargs.get("vllm_config", args[0] if args else None)
        cached = None if config is None else int(config.cache_config.block_size)
        if block_size is not None and cached is not None and int(block_size) != cached:
            # Dropping it would silently schedule with another block size.
            raise ValueError(f"Scheduler(block_size={block_size}) differs from the cache "
                             f"config's {cached}, the only block size this vLLM's scheduler "
                             "uses")
        return original(*args, **kwargs)

    return build


def _scheduler_params() -> dict[str, bool]:
    # Read, not imported: importing the scheduler module costs seconds in apply().
    init = source_def("vllm.v1.core.sched.scheduler", "Scheduler.__init__")
    return {} if init is None else init.params


def _probe() -> str | None:
    if _scheduler_params().get("block_size") is not False:  # False: required, no default
        return "Scheduler.__init__ does not require block_size"
    return None


def _probe_v04() -> str | None:
    if "block_size" in _scheduler_params():
        return "Scheduler.__init__ takes block_size"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "Scheduler",
                           lambda original: with_defaults(original, block_size=_block_size))


def _patch_v04(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "Scheduler", _without_block_size)


ADAPTER = Adapter(
    id=ID,
    summary="Scheduler(...) built by speculators 0.3.0 gets block_size from the cache config",
    why="Scheduler(...) without block_size raises TypeError from vLLM 0.11.1",
    how="wraps the generator's Scheduler to pass block_size from the cache config",
    upstream="vLLM 0.11.1: Scheduler.__init__(..., block_size: int) is required",
    upstream_ref="none found: the required parameter first appears in the vLLM 0.11.1 wheel; no "
    "PR for it was located",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 passes block_size)",
)

ADAPTER_V04 = Adapter(
    id=ID_V04,
    summary="Scheduler(..., block_size=) built by speculators 0.4.0 drops the argument vLLM "
    "0.11.0 does not take (the scheduler reads the same value from the cache config)",
    why="vLLM 0.11.0's Scheduler rejects speculators 0.4.0's block_size argument (TypeError)",
    how="wraps the generator's Scheduler to drop block_size when it equals the cache config's "
    "(ValueError when it differs)",
    upstream="vLLM 0.11.1: Scheduler.__init__(..., block_size: int) added; speculators 0.4.0 "
    "passes it",
    upstream_ref="none found: the required parameter first appears in the vLLM 0.11.1 wheel; no "
    "PR for it was located",
    vllm=spec("<0.11.1"),
    speculators=spec("==0.4.*"),
    side=Side.DRIVER,
    probe=_probe_v04,
    patch=_patch_v04,
    remove_when="vLLM 0.11.0 is no longer supported with speculators 0.4.0",
)
