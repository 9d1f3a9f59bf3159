"""vLLM 0.33.0 moved the KV-cache planning helpers from ``vllm.v1.core.kv_cache_utils``
to ``vllm.v1.core.kv_cache_planning``; speculators 0.3.0 and 0.4.0 import
``_get_kv_cache_groups_uniform_spec``, ``get_kv_cache_config_from_groups`` and
``unify_hybrid_kv_cache_specs`` from the old module, so importing the generator
raises ImportError.

The old module gets the moved names back as aliases of the new ones (the same
objects); vLLM's own code keeps importing them from their new home. Workers need
them as well: ``speculators.data_generation``'s ``__init__`` imports the generator,
so a worker importing the extension class imports the generator first.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, module_source, require_in_source
from ...versions import spec

ID = "vllm.kv_cache_planning_moved"
OLD = "vllm.v1.core.kv_cache_utils"
NEW = "vllm.v1.core.kv_cache_planning"
MOVED = ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups",
         "unify_hybrid_kv_cache_specs")


def _probe() -> str | None:
    old, new = module_source(OLD), module_source(NEW)
    if new is None:
        return f"{NEW} does not exist (the helpers are still in {OLD})"
    if old is not None and all(f"def {name}(" in old for name in MOVED):
        return f"{OLD} still defines {list(MOVED)}"
    return require_in_source(GENERATOR, f"from {OLD} import")


def _patch(patcher: Patcher) -> None:
    def on_old_module(module: ModuleType) -> None:
        planning = importlib.import_module(NEW)
        for name in MOVED:
            if not hasattr(module, name):
                patcher.add(module, name, getattr(planning, name))

    patcher.on_import(OLD, on_old_module)


ADAPTER = Adapter(
    id=ID,
    summary=f"{OLD} keeps the KV-cache planning helpers speculators imports from it, as "
    f"aliases of {NEW}'s",
    why="without it importing speculators' generator raises ImportError, and so does the worker "
    "extension, which imports the generator",
    how="adds the moved names back to vllm.v1.core.kv_cache_utils as aliases of "
    "vllm.v1.core.kv_cache_planning's",
    upstream=f"vLLM 0.33.0: {', '.join(MOVED)} moved to {NEW}",
    upstream_ref="none found: the helpers first live in kv_cache_planning in the vLLM 0.33.0 "
    "wheel; vLLM PR #42309 proposes this extraction but was open when last seen",
    vllm=spec(">=0.33.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
