"""``collective_rpc`` with one return contract on every vLLM release and executor class.

vLLM's own signatures disagree: ``MultiprocExecutor`` takes ``unique_reply_rank``
and returns a one-element list up to 0.11.0 but the bare result from 0.11.1;
``UniProcExecutor`` has ``single_value`` instead (0.11.1+); the legacy Ray
executor and ``LLM`` take neither and always return a list. This module hides
that behind one contract.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from packaging.version import Version

from ..versions import detect

# vLLM 0.11.1 (PR #28012 and the executor rework): unique_reply_rank returns the bare value.
BARE_UNIQUE_REPLY_SINCE = Version("0.11.1")


@lru_cache(maxsize=1)
def unique_reply_is_bare() -> bool:
    """Whether the installed MultiprocExecutor returns ``result`` rather than ``[result]``."""
    env = detect()
    if env.vllm is None:
        raise ImportError("vLLM is not installed")
    return env.vllm.version >= BARE_UNIQUE_REPLY_SINCE


def collective_rpc(
    executor: Any,
    method: str | Callable[..., Any],
    *,
    rank: int | None = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> Any:
    """Run ``method`` on the workers of ``executor`` and return, on every vLLM release:

    - ``rank=None``: a ``list`` with one result per worker, in rank order;
    - ``rank=r``: worker ``r``'s result itself, never wrapped in a list
      (only that worker replies where the executor supports it).

    ``executor`` may be a ``MultiprocExecutor`` (and ``RayExecutorV2``), a
    ``UniProcExecutor`` / ``ExecutorWithExternalLauncher``, a legacy Ray
    executor, or anything with ``LLM.collective_rpc``'s signature.
    """
    call = executor.collective_rpc
    if rank is None:
        return list(call(method, timeout=timeout, args=args, kwargs=kwargs))
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    params = _parameters(call)
    if "unique_reply_rank" in params:
        world = _world_size(executor)
        if world is not None and rank >= world:
            raise ValueError(f"rank {rank} requested but the executor has {world} worker(s)")
        result = call(method, timeout=timeout, args=args, kwargs=kwargs, unique_reply_rank=rank)
        return result if unique_reply_is_bare() else result[0]
    results = call(method, timeout=timeout, args=args, kwargs=kwargs)
    if rank >= len(results):
        raise ValueError(f"rank {rank} requested but the executor has {len(results)} worker(s)")
    return results[rank]


def _world_size(executor: Any) -> int | None:
    for owner in (getattr(executor, "parallel_config", None),
                  getattr(getattr(executor, "vllm_config", None), "parallel_config", None),
                  executor):
        size = getattr(owner, "world_size", None)
        if isinstance(size, int):
            return size
    return None


def _parameters(call: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        return set()
