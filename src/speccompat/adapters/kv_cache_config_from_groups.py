"""``get_kv_cache_config_from_groups`` lost its ``kv_cache_specs`` argument in vLLM 0.12.0.

The specs are already inside the groups speculators 0.3.0 passes, so the
argument is dropped at the call rather than recomputed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import GENERATOR, parameters
from ..versions import spec

ID = "vllm.kv_cache_utils.kv_cache_specs_removed"


def _without_specs(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("kv_cache_specs", None)
        return original(*args, **kwargs)

    return call


def _probe() -> str | None:
    from vllm.v1.core import kv_cache_utils

    if "kv_cache_specs" in parameters(kv_cache_utils.get_kv_cache_config_from_groups):
        return "get_kv_cache_config_from_groups still takes kv_cache_specs"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "get_kv_cache_config_from_groups", _without_specs)


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's get_kv_cache_config_from_groups call drops kv_cache_specs",
    upstream="vLLM 0.12.0: get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, "
    "available_memory)",
    vllm=spec(">=0.12.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
