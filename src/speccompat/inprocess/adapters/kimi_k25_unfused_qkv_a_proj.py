"""vLLM 0.15.x's ``KimiK25ForConditionalGeneration.load_weights`` always stacks the
checkpoint's ``q_a_proj`` and ``kv_a_proj_with_mqa`` into ``fused_qkv_a_proj``, which only
the MLA attention has. With MLA off (``VLLM_MLA_DISABLE=1``, the only way DeepSeek-style
attention runs on vLLM's CPU builds) the layers are ``DeepseekV2Attention``, which keeps the
two projections apart, and loading stops with a ``KeyError`` on ``...fused_qkv_a_proj...``.

vLLM 0.16.0 loads Kimi's text model through ``DeepseekV2ForCausalLM.load_weights``, which
falls back to plain weight loading when there is no fused parameter ("QKV fusion is
optional"). Here those two weights take the same fallback, into the very parameters the
attention has; every other weight goes through Kimi's own loader unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import require_in_source
from ...versions import spec

ID = "vllm.kimi_k25_unfused_qkv_a_proj"
KIMI_K25 = "vllm.model_executor.models.kimi_k25"
RAW_MAPPING = '(".fused_qkv_a_proj", ".q_a_proj", 0)'
# Kimi's own renaming of the text model's checkpoint names (its _KEYS_TO_MODIFY_MAPPING).
RENAMES = {"language_model.model": "language_model"}
UNFUSED = (".q_a_proj", ".kv_a_proj_with_mqa")


def unfused_target(name: str, params: dict[str, Any]) -> str | None:
    """The parameter a checkpoint weight loads into unfused, or ``None`` where Kimi's own
    loader should have it (a fused parameter exists, or it is not such a weight)."""
    part = next((p for p in UNFUSED if p in name), None)
    if part is None:
        return None
    for old, new in RENAMES.items():
        name = name.replace(old, new)
    if name.replace(part, ".fused_qkv_a_proj") in params or name not in params:
        return None  # MLA attention, or e.g. a speculative layer Kimi's loader skips
    return name


def _load_unfused(model: Any, weights: Iterable[Any]) -> Iterator[Any]:
    """``weights`` without the unfused projections, which are loaded on the way."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    params = dict(model.named_parameters())
    for item in weights:
        target = unfused_target(item[0], params)
        if target is None:
            yield item
            continue
        kwargs = item[2] if len(item) > 2 else {}  # Kimi's loader accepts (name, w, kwargs)
        param = params[target]
        getattr(param, "weight_loader", default_weight_loader)(param, item[1], **kwargs)


def _loading_unfused(load_weights: Callable[..., Any]) -> Callable[..., Any]:
    def load_weights_with_unfused_qkv_a_proj(self: Any, weights: Iterable[Any]) -> Any:
        return load_weights(self, _load_unfused(self, weights))

    load_weights_with_unfused_qkv_a_proj.__wrapped__ = load_weights  # type: ignore[attr-defined]
    return load_weights_with_unfused_qkv_a_proj


def _probe() -> str | None:
    return require_in_source(KIMI_K25, RAW_MAPPING, '"language_model.model": "language_model"')


def _patch(patcher: Patcher) -> None:
    patcher.on_import(KIMI_K25, lambda module: patcher.wrap(
        module.KimiK25ForConditionalGeneration, "load_weights", _loading_unfused))


ADAPTER = Adapter(
    id=ID,
    summary="Kimi-K2.5's checkpoint q_a_proj / kv_a_proj_with_mqa load unfused into "
    "attention without fused_qkv_a_proj (MLA disabled, e.g. on vLLM CPU builds)",
    why="without it the model does not load with VLLM_MLA_DISABLE=1 (KeyError on "
    "fused_qkv_a_proj); with MLA the fused parameters exist and nothing is diverted",
    how="wraps KimiK25ForConditionalGeneration.load_weights to load q_a_proj and "
    "kv_a_proj_with_mqa into the unfused parameters when no fused_qkv_a_proj exists",
    upstream="vLLM 0.16.0: Kimi-K2.5's language_model is a DeepseekV2ForCausalLM, whose "
    "load_weights falls back to unfused loading when fused_qkv_a_proj is absent",
    upstream_ref="none found: Kimi-K2.5's language_model is first a DeepseekV2ForCausalLM in the "
    "vLLM 0.16.0 wheel; no PR for it was located",
    vllm=spec(">=0.15.0,<0.16.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.15.x is no longer supported",
)
