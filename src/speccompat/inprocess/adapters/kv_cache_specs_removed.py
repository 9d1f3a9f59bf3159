"""``get_kv_cache_config_from_groups`` lost its ``kv_cache_specs`` argument in vLLM 0.12.0.

The specs are already inside the groups speculators 0.3.0 passes, so the
argument is dropped at the call rather than recomputed. speculators 0.4.0 does
not pass it, which vLLM 0.11.x requires; there it is rebuilt from the groups
(layer name -> its group's spec), from which vLLM 0.12.0 takes the page size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, source_def
from ...versions import spec

ID = "vllm.kv_cache_specs_removed"
ID_V04 = "vllm.kv_cache_specs_removed.speculators_0_4"


def _without_specs(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("kv_cache_specs", None)
        return original(*args, **kwargs)

    return call


def _with_specs(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        # The consumer calls it the vLLM 0.12.0 way, where a third positional is the memory.
        names = ("vllm_config", "kv_cache_groups", "available_memory")
        named = dict(zip(names[: len(args)], args, strict=True))
        named.update(kwargs)
        named.setdefault("kv_cache_specs", {
            name: group.kv_cache_spec
            for group in named["kv_cache_groups"] for name in group.layer_names})
        return original(**named)

    return call


def _planner_params() -> dict[str, bool] | None:
    # Read, not imported (apply() stays fast); vLLM 0.33.0 moved it to kv_cache_planning.
    for module in ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning"):
        found = source_def(module, "get_kv_cache_config_from_groups")
        if found is not None:
            return found.params
    return None


def _probe() -> str | None:
    params = _planner_params()
    if params is None:
        return "get_kv_cache_config_from_groups is gone"
    if "kv_cache_specs" in params:
        return "get_kv_cache_config_from_groups still takes kv_cache_specs"
    return None


def _probe_v04() -> str | None:
    if (_planner_params() or {}).get("kv_cache_specs") is not False:
        return "get_kv_cache_config_from_groups does not require kv_cache_specs"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "get_kv_cache_config_from_groups", _without_specs)


def _patch_v04(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "get_kv_cache_config_from_groups", _with_specs)


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's get_kv_cache_config_from_groups call drops kv_cache_specs",
    why="speculators 0.3.0 passes kv_cache_specs, which get_kv_cache_config_from_groups no longer "
    "takes from vLLM 0.12.0 (TypeError)",
    how="wraps the generator's get_kv_cache_config_from_groups to drop the kv_cache_specs argument",
    upstream="vLLM 0.12.0: get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, "
    "available_memory)",
    upstream_ref="none found: the parameter is first gone in the vLLM 0.12.0 wheel; no PR for it "
    "was located",
    vllm=spec(">=0.12.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)

ADAPTER_V04 = Adapter(
    id=ID_V04,
    summary="speculators 0.4.0's get_kv_cache_config_from_groups call gets the kv_cache_specs "
    "vLLM 0.11.x requires, rebuilt from the groups",
    why="speculators 0.4.0 omits kv_cache_specs, which vLLM 0.11.x requires (TypeError)",
    how="wraps the generator's get_kv_cache_config_from_groups to rebuild kv_cache_specs from the "
    "groups (layer name -> its group's spec)",
    upstream="vLLM 0.12.0: get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, "
    "available_memory); speculators 0.4.0 calls it that way",
    upstream_ref="none found: the parameter is first gone in the vLLM 0.12.0 wheel; no PR for it "
    "was located",
    vllm=spec("<0.12.0"),
    speculators=spec("==0.4.*"),
    side=Side.DRIVER,
    probe=_probe_v04,
    patch=_patch_v04,
    remove_when="vLLM 0.11.x is no longer supported with speculators 0.4.0",
)
