"""``get_hash_fn_by_name`` moved from ``vllm.utils`` to ``vllm.utils.hashing`` in vLLM 0.11.1.

speculators 0.4.0 (written for vLLM 0.12-0.16) imports it from the new place, so
its generator does not import at all on 0.11.0, and neither does its worker
extension in vLLM's workers (``speculators.data_generation`` imports the generator).
The missing module is provided in both, holding vLLM 0.11.0's own function, which
is what ``vllm.utils.hashing`` re-homed.
"""

from __future__ import annotations

import importlib.machinery
import types

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, require_in_source
from ...versions import spec

ID = "vllm.get_hash_fn_by_name_moved"
MODULE = "vllm.utils.hashing"
IMPORT = "from vllm.utils.hashing import get_hash_fn_by_name"


def _probe() -> str | None:
    import importlib.util

    import vllm.utils

    if not hasattr(vllm.utils, "get_hash_fn_by_name"):
        return "vllm.utils has no get_hash_fn_by_name"
    if importlib.util.find_spec(MODULE) is not None:
        return f"{MODULE} exists"
    return require_in_source(GENERATOR, IMPORT)


def _patch(patcher: Patcher) -> None:
    import vllm.utils

    module = types.ModuleType(MODULE, f"speccompat: vLLM 0.11.1's {MODULE}, from vllm.utils")
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE, None)
    module.get_hash_fn_by_name = vllm.utils.get_hash_fn_by_name  # type: ignore[attr-defined]
    patcher.add_module(MODULE, module)


ADAPTER = Adapter(
    id=ID,
    summary=f"speculators 0.4.0's `{IMPORT}` finds vLLM 0.11.0's vllm.utils.get_hash_fn_by_name",
    why="on vLLM 0.11.0 speculators 0.4.0's generator does not import (ModuleNotFoundError: "
    "vllm.utils.hashing), nor does the worker extension, which imports it",
    how="registers a vllm.utils.hashing module holding vLLM 0.11.0's own "
    "vllm.utils.get_hash_fn_by_name",
    upstream="vLLM 0.11.1: get_hash_fn_by_name moved to vllm.utils.hashing (vllm.utils split "
    "into modules)",
    upstream_ref="vLLM PR #27151 \"[Chore] Separate out hashing utilities from vllm.utils\" (in "
    "0.11.1)",
    vllm=spec("<0.11.1"),
    speculators=spec("==0.4.*"),
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.11.0 is no longer supported with speculators 0.4.0",
)
