"""transformers 5.24.0 removed ``transformers.modeling_attn_mask_utils``, and speculators
0.3.0/0.4.0 import ``_prepare_4d_causal_attention_mask`` from it at the top of their
EAGLE (v1) model module, which ``import speculators`` loads: ModuleNotFoundError.
vLLM 0.19.1 to 0.23.x accept transformers 5 and 0.24.0 to 0.30.0 any >= 5.5.3 (0.29.0:
>= 5.10.4), so a fresh install beside speculators 0.3.0 got 5.24.0 on all of them.
transformers 5.25.0 (2026-12-01) ships the module again (deprecated, with a
FutureWarning), so only 5.24.x needs the stand-in.

Hidden-state extraction never builds the mask; only training the EAGLE (v1) draft
model does. The removed module comes back as a stand-in whose function raises a
clear error when called, instead of a copy of code transformers dropped.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...errors import SpeccompatError
from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import module_source, require_in_source
from ...versions import spec

ID = "transformers.attn_mask_utils_removed"
REMOVED = "transformers.modeling_attn_mask_utils"
CONSUMER = "speculators.models.eagle"


class RemovedUpstreamError(SpeccompatError, NotImplementedError):
    """A function of a module upstream removed was called through speccompat's stand-in."""


def _prepare_4d_causal_attention_mask(*args: Any, **kwargs: Any) -> Any:
    raise RemovedUpstreamError(
        f"{REMOVED}._prepare_4d_causal_attention_mask was removed in transformers 5.24.x; "
        "speccompat only lets speculators import (hidden-state extraction does not use it). "
        "To train speculators' EAGLE (v1) model, install transformers<5.24 or >=5.25 "
        "(pip install 'transformers!=5.24.*'; 5.25.0 has the module again).")


def stand_in() -> ModuleType:
    module = ModuleType(REMOVED, "speccompat stand-in for a module transformers 5.24.x lacks")
    module._prepare_4d_causal_attention_mask = _prepare_4d_causal_attention_mask  # type: ignore[attr-defined]
    return module


def _probe() -> str | None:
    if module_source("transformers") is None:
        return "transformers is not installed"
    if module_source(REMOVED) is not None:
        return f"{REMOVED} still exists"
    return require_in_source(CONSUMER, f"from {REMOVED} import _prepare_4d_causal_attention_mask")


def _patch(patcher: Patcher) -> None:
    patcher.on_import("transformers", lambda _: patcher.add_module(REMOVED, stand_in()))


ADAPTER = Adapter(
    id=ID,
    summary=f"{REMOVED} exists again as a stand-in, so speculators imports under "
    "transformers 5.24.x",
    why="without it `import speculators` raises ModuleNotFoundError under transformers 5.24.x: "
    "the package import loads its EAGLE (v1) model module, which imports the mask helper; "
    "extraction never calls it",
    how="registers a stand-in transformers.modeling_attn_mask_utils whose "
    "_prepare_4d_causal_attention_mask raises a clear error if called",
    upstream="transformers 5.24.0: "
    f"{REMOVED} removed (resolved by default beside speculators 0.3.0 on vLLM 0.19.1 and "
    "newer, and on every vLLM >= 0.24.0); transformers 5.25.0 ships it again, deprecated",
    upstream_ref="none found: the module is absent from the transformers 5.24.0 wheel and back "
    "in the 5.25.0 wheel; no PR or release note for either was located",
    vllm=None,
    speculators=spec(">=0.3,<0.5"),
    transformers=spec(">=5.24.0,<5.25.0"),
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported, or transformers 5.24.x is "
    "no longer supported",
)
