"""Id 0 on vLLM's Kimi-Linear stack: refused where the capture aliases the embeddings and
speccompat's copy (``vllm.kimi_linear_first_layer_alias``) is not applied.

vLLM's ``KimiLinearModel`` (``vllm/models/kimi_k3/nvidia/model.py``, 0.27.0 to 0.34.0 at
least; the stack of ``KimiLinearForCausalLM``, ``KimiK3ForConditionalGeneration`` and
``KimiK31ForConditionalGeneration``) captures id 0 itself, not through
``EagleModelMixin._maybe_add_hidden_state``::

    if self.use_attn_res or residual is None:
        aux_hidden_states.append(hidden_states)      # the embeddings tensor, no copy

Without attention residuals (``config.attn_res_block_size is None``: Kimi-Linear's
checkpoints, K3 configs with them off) the first ``KimiDecoderLayer`` then takes that very
tensor as its residual (``residual = hidden_states``) and its post-attention norm adds into
it in place (``post_attention_layernorm(hidden_states, residual)``, the fused add-RMSNorm),
so id 0's slot holds the first layer's update, not the embeddings. Measured on an H200 with
vLLM 0.34.0, eager (``vllm.LLM``, a tiny K3 config with attention residuals off): id 0
differed from the embeddings by max |diff| 4.18 (9 tokens) and 4.44 (130 tokens), ids 1..6
bit-equal. With attention residuals on (real K3) the embeddings go to ``prefix_sum`` and a
served eager run wrote id 0 bit-equal to the embeddings. Compiled mode was not measured.

``vllm.eagle_mixin_capture_alias`` copies id 0 only where the mixin's method appends it, so
it does not reach this stack; ``vllm.kimi_linear_first_layer_alias`` does: it gives the first
``KimiDecoderLayer`` a copy of its input, so the captured embeddings are never added into, and
where it is applied in the process (``servable_aux_ids(..., kimi_first_id_copied=True)``, from
the layer-id adapter's ``patching.applied()``) id 0 is served. This rule is the fallback where
the copy is not applied (``SPECCOMPAT_SKIP=vllm.kimi_linear_first_layer_alias``, its probe
failing on a newer vLLM): speccompat then refuses id 0 for these configs at start-up
(``servable_aux_ids``, through ``ExtractHiddenStatesConfig``), with a
:class:`~speccompat.layers.LayerIdError` that says why and to leave id 0 out; ids 1..N are
captured as ``hidden_states + residual``, a tensor of their own, and are served either way.

Per release (model sources, ``tools/wheel_source.py``):

- 0.17.0-0.26.0: ``vllm/model_executor/models/kimi_linear.py``; ``KimiLinearForCausalLM``
  is not ``SupportsEagle3`` and ``KimiLinearModel`` captures nothing; no K3.
- 0.27.0-0.27.1: ``vllm/models/kimi_k3/nvidia/model.py``; ``KimiK3ForConditionalGeneration``
  is ``SupportsEagle3``, ``KimiLinearForCausalLM`` not yet; the aliasing capture above.
- 0.28.0-0.34.0: both ``SupportsEagle3``, the same capture (0.34.0 lines 1231-1238);
  0.34.0 registers ``KimiK31ForConditionalGeneration`` to the same class.
- ROCm/XPU import ``KimiLinearForCausalLM`` from ``amd/linear.py``, whose ``KimiLinearModel``
  captures through the mixin (copied by ``vllm.eagle_mixin_capture_alias``); the rule
  cannot tell the platform at configuration time and refuses id 0 there too.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version


@dataclass(frozen=True)
class IdRule:
    """One per-architecture id rule and its record."""

    what: str
    why: str
    upstream_ref: str
    versions: str
    remove_when: str


RULE = IdRule(
    what="id 0 is refused on vLLM's KimiLinearModel stack without attention residuals "
    "where vllm.kimi_linear_first_layer_alias (the copy of id 0) is not applied",
    why="KimiLinearModel.forward appends the embeddings tensor itself as id 0, and the first "
    "KimiDecoderLayer takes it as its residual and adds into it in place: id 0 would hold the "
    "first layer's in-place update (H200, vLLM 0.34.0, eager: max |diff| 4.18-4.44 from the "
    "embeddings, ids 1..6 bit-equal)",
    upstream_ref="vllm/models/kimi_k3/nvidia/model.py:1231-1238 (0.34.0, "
    "KimiLinearModel.forward: `if self.use_attn_res or residual is None: "
    "aux_hidden_states.append(hidden_states)`), :866-868 (KimiDecoderLayer._pre_attn_norm: "
    "`residual = hidden_states`), :897 (_post_attn_norm's fused add-RMSNorm)",
    versions="KimiK3ForConditionalGeneration >= 0.27.0, KimiLinearForCausalLM >= 0.28.0, "
    "KimiK31ForConditionalGeneration >= 0.34.0; every release to 0.34.0 (the latest read)",
    remove_when="vLLM's KimiLinearModel captures a copy of id 0 (or the first layer stops "
    "adding into it); until then it is the fallback where vllm.kimi_linear_first_layer_alias "
    "is skipped or its probe fails",
)

# Architecture -> the first vLLM release whose KimiLinearModel serves it EAGLE-3 aux states.
FIRST_RELEASE = {
    "KimiLinearForCausalLM": Version("0.28.0"),
    "KimiK3ForConditionalGeneration": Version("0.27.0"),
    "KimiK31ForConditionalGeneration": Version("0.34.0"),
}
# Where the config is not given: what the architecture's checkpoints use. Kimi-Linear's
# (and vLLM's KimiLinearConfig default) have no attn_res_block_size; real K3 has one.
_ATTENTION_RESIDUALS_BY_DEFAULT = {
    "KimiLinearForCausalLM": False,
    "KimiK3ForConditionalGeneration": True,
    "KimiK31ForConditionalGeneration": True,
}


def attention_residuals(architecture: str, config: object | None) -> bool:
    """Whether vLLM's ``KimiLinearModel`` runs ``architecture`` with attention residuals:
    ``use_attn_res = config.attn_res_block_size is not None`` on the text config (K3's
    ``text_config``, Kimi-Linear's config itself). Without a config, what the architecture's
    checkpoints use."""
    if config is None:
        return _ATTENTION_RESIDUALS_BY_DEFAULT.get(architecture, False)
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else getattr(config, "text_config", config)
    return getattr(text, "attn_res_block_size", None) is not None


def first_id_limit(architecture: str, num_layers: int, version: Version,
                   config: object | None = None) -> str | None:
    """Why id 0 cannot be served for ``architecture`` on vLLM ``version`` (a base version)
    without speccompat's copy, or ``None`` where it can (another architecture, an older
    release, attention residuals on). ``config``: the target model's config (top-level or
    text). ``servable_aux_ids`` asks only where ``vllm.kimi_linear_first_layer_alias`` is not
    applied."""
    first = FIRST_RELEASE.get(architecture)
    if first is None or version < first or attention_residuals(architecture, config):
        return None
    return (f"id 0 on {architecture} with vLLM {version} would hold the first layer's "
            f"in-place update instead of the embeddings: vLLM's KimiLinearModel captures "
            f"the embeddings tensor itself and, without attention residuals, its first layer "
            f"adds into it (measured on an H200 with vLLM 0.34.0, eager); ids 1..{num_layers} "
            f"are served correctly: leave out id 0")
