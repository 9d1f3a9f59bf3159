"""vLLM's ``KimiLinearModel`` (``vllm/models/kimi_k3/nvidia/model.py``, 0.27.0 onwards; the
stack of ``KimiLinearForCausalLM`` and Kimi-K3/K3.1) appends id 0 itself: without attention
residuals the embeddings tensor, no copy, which the first ``KimiDecoderLayer`` takes as its
residual and adds into in place (fused add-RMSNorm). Seen on an H200 with vLLM 0.34.0, eager:
id 0 off the embeddings by max |diff| 4.18-4.44, ids 1..6 bit-equal. speccompat's
``vllm.kimi_linear_first_layer_alias`` copies id 0 there
(tests/contract/server/test_kimi_linear_first_layer_alias.py); without it ``servable_aux_ids``
refuses id 0 (``server/kimi_first_id.py``, the fallback pinned here).

These tests read the installed vLLM's source (the module is not imported: the NVIDIA model
pulls CUDA-only kernels) and tie what they find to the table: where the aliasing capture and
the in-place first layer are there, id 0 is refused without attention residuals (and
without the copy) and served with them; where vLLM copies id 0 (or the capture moves), they
fail, and the rule is due for removal."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import speccompat
from speccompat.server.kimi_first_id import FIRST_RELEASE
from speccompat.server.servable import servable_aux_ids
from speccompat.targets import module_source, source_def
from support import requires_vllm, vllm_in

pytestmark = requires_vllm
MODEL = "vllm.models.kimi_k3.nvidia.model"
OLD_MODEL = "vllm.model_executor.models.kimi_linear"
REGISTRY = "vllm.model_executor.models.registry"
# The id-0 capture, 0.27.0 .. 0.34.0: the embeddings themselves where there is no residual.
NO_COPY_BRANCH = re.compile(
    r"if self\.use_attn_res or residual is None:\n\s+aux_hidden_states\.append\(hidden_states\)\n")


def _installed() -> str:
    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version)


def _version() -> object:
    from packaging.version import Version

    return Version(Version(_installed()).base_version)


has_stack = pytest.mark.skipif(
    module_source(MODEL) is None,
    reason=f"vLLM {speccompat.detect().vllm.version if speccompat.detect().vllm else '-'} has "
    f"no {MODEL} (it came with 0.27.0; before it, model_executor/models/kimi_linear.py's "
    "KimiLinearForCausalLM is not SupportsEagle3 and captures no aux states)")


def _body(qualname: str) -> str:
    found = source_def(MODEL, qualname)
    assert found is not None, f"{MODEL} defines no {qualname}"
    return found.text


def _class_head(module: str, name: str) -> str:
    """``class name(...)``'s bases, as written."""
    text = module_source(module) or ""
    found = re.search(rf"^class {name}\((.*?)\):", text, re.M | re.S)
    assert found is not None, f"{module} defines no class {name}"
    return found.group(1)


def _no_attn_res() -> SimpleNamespace:
    return SimpleNamespace(num_hidden_layers=4, attn_res_block_size=None)


@has_stack
def test_raw_id_0_is_the_embeddings_tensor_itself_without_attention_residuals() -> None:
    forward = _body("KimiLinearModel.forward")
    capture = NO_COPY_BRANCH.search(forward)
    assert capture is not None, "KimiLinearModel no longer appends hidden_states for id 0"
    # Nothing copies it between the embedding lookup and the capture.
    before = forward[:capture.end()]
    assert ".clone()" not in before and "copy_(" not in before and ".contiguous()" not in before
    assert "self.start_layer in self.aux_hidden_state_layers" in before
    # Attention residuals are decided by the config's block size, as the rule reads them.
    init = _body("KimiLinearModel.__init__")
    assert "self.use_attn_res = self.attn_res_block_size is not None" in init
    assert "config.attn_res_block_size" in init


@has_stack
def test_raw_the_first_layer_adds_into_that_tensor_in_place() -> None:
    """``residual = hidden_states`` (the captured embeddings) before layer 0, then the
    post-attention norm's fused add (``RMSNorm(x, residual)``, in place on CUDA)."""
    pre = _body("KimiDecoderLayer._pre_attn_norm")
    assert re.search(r"if not self\.use_attn_res:.*?if residual is None:\n\s+"
                     r"residual = hidden_states\n", pre, re.S), pre
    post = _body("KimiDecoderLayer._post_attn_norm")
    assert re.search(r"if not self\.use_attn_res:\n\s+hidden_states, residual = "
                     r"self\.post_attention_layernorm\(\s*hidden_states, residual\s*\)",
                     post), post


@has_stack
def test_raw_ids_after_a_layer_are_tensors_of_their_own() -> None:
    forward = _body("KimiLinearModel.forward")
    assert "aux_hidden_state = hidden_states + residual" in forward


@has_stack
def test_the_table_refuses_id_0_where_the_capture_aliases() -> None:
    forward = _body("KimiLinearModel.forward")
    aliases = NO_COPY_BRANCH.search(forward) is not None
    for architecture, first in FIRST_RELEASE.items():
        if _version() < first:  # type: ignore[operator]
            continue
        refused = servable_aux_ids(architecture, 4, _installed(), config=_no_attn_res())
        assert (refused.low == 1) is aliases, (architecture, _installed())
        with_res = SimpleNamespace(num_hidden_layers=4, attn_res_block_size=4)
        assert servable_aux_ids(architecture, 4, _installed(), config=with_res).low == 0


@has_stack
def test_the_rules_first_releases_match_the_sources() -> None:
    """KimiLinearForCausalLM is SupportsEagle3 from 0.28.0, Kimi-K3 from 0.27.0; 0.34.0
    registers KimiK31ForConditionalGeneration to the same class."""
    version = _version()
    linear = "SupportsEagle3" in _class_head(MODEL, "KimiLinearForCausalLM")
    assert linear is (version >= FIRST_RELEASE["KimiLinearForCausalLM"])  # type: ignore[operator]
    assert "SupportsEagle3" in _class_head(MODEL, "KimiK3ForConditionalGeneration")
    registry = module_source(REGISTRY) or ""
    k31 = '"KimiK31ForConditionalGeneration": (' in registry
    assert k31 is (version >= FIRST_RELEASE["KimiK31ForConditionalGeneration"])  # type: ignore[operator]
    for name in ("KimiLinearForCausalLM", "KimiK3ForConditionalGeneration"):
        assert re.search(rf'"{name}": \(\s*"vllm\.models\.kimi_k3",\s*"{name}",', registry), name


@vllm_in(">=0.11.1,<0.27.0", "Kimi-Linear came with vLLM 0.11.1; from 0.27.0 it lives in "
         "vllm/models/kimi_k3 (tests above)")
def test_raw_before_0_27_kimi_linear_captures_nothing() -> None:
    text = module_source(OLD_MODEL)
    assert text is not None, f"{OLD_MODEL} is not installed"
    assert "aux_hidden_state" not in text and "SupportsEagle3" not in text
    # No Kimi refusal before 0.27: the release's rule for every model (0..4; 1..3 on 0.17).
    assert servable_aux_ids("KimiLinearForCausalLM", 4, _installed(),
                            config=_no_attn_res()) == servable_aux_ids("LlamaForCausalLM", 4,
                                                                       _installed())
