"""A generator that builds ``MultiprocExecutor`` itself forks its workers unless this
process asked for spawn, and a forked worker cannot use CUDA once the parent has
("Cannot re-initialize CUDA in forked subprocess").

vLLM switches to spawn on its own when it sees CUDA initialised: ``get_mp_context()``
sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in ``os.environ``, then reads the method
back through ``vllm.envs``. From 0.12.0, once an engine has run in this process (an
in-process ``LLM``, a benchmark before the extraction), ``vllm.envs`` caches every
variable (``enable_envs_cache``), so that read still says "fork". Before the
generator builds its executor, the forced method is made visible to that read.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from ...errors import SpeccompatWarning
from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, require_in_source
from ...versions import spec

ID = "vllm.spawn_after_cuda_init"
METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # not imported: nothing can have touched CUDA
    return bool(torch is not None and torch.cuda.is_initialized())


def cached_method() -> str:
    from vllm import envs

    return str(envs.VLLM_WORKER_MULTIPROC_METHOD)


def force_spawn() -> None:
    """Make vLLM's next start-method read say spawn, cache or not."""
    from vllm import envs

    os.environ[METHOD_ENV] = "spawn"
    cached_getattr = vars(envs).get("__getattr__")
    cache_clear = getattr(cached_getattr, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()  # drops every cached value; each is re-read from os.environ once


def spawning_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        if cuda_initialized() and cached_method() != "spawn":
            warnings.warn(
                "CUDA is initialised in this process and vLLM's cached worker start method "
                f"is {cached_method()!r}: building the generator's executor with 'spawn' "
                "(forked workers cannot use CUDA). Guard your script with "
                "`if __name__ == '__main__':`.", SpeccompatWarning, stacklevel=2)
            force_spawn()
        return original(*args, **kwargs)

    build.__name__ = getattr(original, "__name__", "factory")
    build.__qualname__ = getattr(original, "__qualname__", build.__name__)
    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


def _probe() -> str | None:
    from vllm import envs

    if "enable_envs_cache" not in vars(envs):
        return "vllm.envs has no enable_envs_cache (nothing caches the start method)"
    return require_in_source(GENERATOR, "MultiprocExecutor(")


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor", spawning_factory)


ADAPTER = Adapter(
    id=ID,
    summary="the generator's MultiprocExecutor spawns its workers when CUDA is already "
    "initialised in this process, also after vLLM cached its environment",
    why="a forked worker fails at its first CUDA call (\"Cannot re-initialize CUDA in forked "
    "subprocess\"); spawn is what vLLM itself chooses",
    how="wraps the generator's MultiprocExecutor factory: with CUDA initialised and a cached "
    "start method other than spawn, sets spawn and clears vllm.envs' cache first",
    upstream="vLLM 0.12.0: vllm.envs caches variables after an engine starts "
    "(enable_envs_cache), hiding get_mp_context()'s forced spawn",
    upstream_ref="vLLM PR #26146 introduced the environment-variable cache (as vLLM PR #27632 "
    "describes); it hides the forced spawn from 0.12.0",
    vllm=spec(">=0.12.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
