"""Id 0 on vLLM's KimiLinearModel stack (Kimi-Linear, Kimi-K3/K3.1): served where
speccompat's copy (``vllm.kimi_linear_first_layer_alias``) is applied in the process; without
it, refused at start-up where the capture aliases the embeddings the first layer updates in
place (no attention residuals); served where attention residuals are on. The upstream capture
itself is pinned in tests/contract/server/test_kimi_linear_id0_alias.py, the copy in
tests/contract/server/test_kimi_linear_first_layer_alias.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speccompat.layers import LayerIdError
from speccompat.server.kimi_first_id import (
    FIRST_RELEASE,
    RULE,
    attention_residuals,
    first_id_limit,
)
from speccompat.server.servable import servable_aux_ids

LINEAR = "KimiLinearForCausalLM"
K3 = "KimiK3ForConditionalGeneration"
K31 = "KimiK31ForConditionalGeneration"
IDS = "eagle_aux_hidden_state_layer_ids"


def _text(attn_res_block_size: int | None) -> SimpleNamespace:
    """vLLM's KimiLinearConfig as the model reads it (``attn_res_block_size`` always set)."""
    return SimpleNamespace(num_hidden_layers=4, attn_res_block_size=attn_res_block_size)


class _K3Config(SimpleNamespace):
    """KimiK3Config's shape: the Kimi-Linear text config under ``get_text_config()``."""

    def get_text_config(self) -> SimpleNamespace:
        return self.text_config  # type: ignore[no-any-return]


def _k3(attn_res_block_size: int | None) -> _K3Config:
    return _K3Config(architectures=[K3], text_config=_text(attn_res_block_size))


@pytest.mark.parametrize(("architecture", "vllm", "config", "low"), [
    # No attention residuals: the first layer adds into the captured embeddings.
    (LINEAR, "0.34.0", _text(None), 1),
    (LINEAR, "0.28.0", _text(None), 1),
    (LINEAR, "0.34.0", None, 1),  # Kimi-Linear's checkpoints have no attn_res_block_size
    (K3, "0.34.0", _k3(None), 1),
    (K3, "0.27.0", _k3(None), 1),
    (K3, "0.34.0", _text(None), 1),  # the text config given directly
    (K31, "0.34.0", _k3(None), 1),
    (K3, "0.35.0.dev3+gabc", _k3(None), 1),  # no upstream fix known: newer releases too
    # Attention residuals on: id 0 is the embeddings (bit-equal, H200, 0.34.0).
    (K3, "0.34.0", _k3(4), 0),
    (K31, "0.34.0", _k3(8), 0),
    (LINEAR, "0.34.0", _text(4), 0),
    (K3, "0.34.0", None, 0),  # real K3 runs with attention residuals
    # Releases before the stack served EAGLE-3 aux states for the architecture.
    (LINEAR, "0.26.0", _text(None), 0),  # model_executor/models/kimi_linear.py, no capture
    (LINEAR, "0.27.1", _text(None), 0),  # not SupportsEagle3 yet
    (K3, "0.26.0", _k3(None), 0),
    (K31, "0.33.0", _k3(None), 0),
    # Other architectures are untouched.
    ("LlamaForCausalLM", "0.34.0", _text(None), 0),
    ("KimiK25ForConditionalGeneration", "0.34.0", _text(None), 1),  # DeepSeek's own rule
])
def test_first_id_per_architecture_release_and_config(architecture: str, vllm: str,
                                                      config: object, low: int) -> None:
    servable = servable_aux_ids(architecture, 4, vllm, config=config)
    assert (servable.low, servable.high) == (low, 4)
    assert servable.check(list(range(low, 5)), IDS) == list(range(low, 5))


def test_refused_id_0_says_what_why_and_what_to_do() -> None:
    servable = servable_aux_ids(LINEAR, 4, "0.34.0", config=_text(None))
    with pytest.raises(LayerIdError) as error:
        servable.check([0, 2, 4], f"{IDS} [0, 2, 4] for {LINEAR} on vLLM 0.34.0")
    text = str(error.value)
    assert text == (
        f"{IDS} [0, 2, 4] for {LINEAR} on vLLM 0.34.0: id 0 (position 0) cannot be served; "
        f"valid: 1..4 (id 0 on {LINEAR} with vLLM 0.34.0 would hold the first layer's "
        "in-place update instead of the embeddings: vLLM's KimiLinearModel captures the "
        "embeddings tensor itself and, without attention residuals, its first layer adds "
        "into it (measured on an H200 with vLLM 0.34.0, eager); ids 1..4 are served "
        "correctly: leave out id 0). Choose ids in 1..4.")


def test_speccompats_first_id_repairs_do_not_lift_the_refusal() -> None:
    """The adapter passes ``first_id_repaired`` where DeepSeek's first-layer adapter is
    applied (it is selected by vLLM version, not by model); it copies nothing here."""
    servable = servable_aux_ids(K3, 4, "0.34.0", first_id_repaired=True,
                                final_id_repaired=True, config=_k3(None))
    assert servable.low == 1
    with pytest.raises(LayerIdError, match="leave out id 0"):
        servable.check([0], IDS)


def test_without_a_config_the_checkpoints_default_decides() -> None:
    assert attention_residuals(LINEAR, None) is False
    assert attention_residuals(K3, None) is True
    assert attention_residuals(K31, None) is True
    assert attention_residuals(K3, _k3(4)) is True
    assert attention_residuals(K3, _k3(None)) is False
    # A config without the field at all: vLLM's KimiLinearConfig defaults it to None.
    assert attention_residuals(LINEAR, SimpleNamespace(num_hidden_layers=4)) is False


def test_limit_names_the_release_and_the_layer_count() -> None:
    from packaging.version import Version

    limit = first_id_limit(K31, 61, Version("0.34.0"), _k3(None))
    assert limit is not None
    assert limit.startswith(f"id 0 on {K31} with vLLM 0.34.0 ")
    assert "ids 1..61 are served correctly" in limit
    assert first_id_limit(K31, 61, Version("0.34.0"), _k3(4)) is None


def test_the_rule_has_its_record() -> None:
    assert set(FIRST_RELEASE) == {LINEAR, K3, K31}
    for field in (RULE.what, RULE.why, RULE.upstream_ref, RULE.versions, RULE.remove_when):
        assert field.strip()
    assert "kimi_k3/nvidia/model.py" in RULE.upstream_ref


@pytest.mark.parametrize("architecture", [LINEAR, K3, K31])
@pytest.mark.parametrize("vllm", ["0.34.0", "0.35.0.dev3+gabc"])
def test_with_the_copy_id_0_is_served(architecture: str, vllm: str) -> None:
    """``kimi_first_id_copied``: the layer-id adapter found the copy applied in the process."""
    servable = servable_aux_ids(architecture, 4, vllm, kimi_first_id_copied=True,
                                config=_k3(None))
    assert (servable.low, servable.high, servable.limits) == (0, 4, ())
    assert servable.check([4, 0, 2], IDS) == [0, 2, 4]


def test_the_copy_lifts_only_the_kimi_refusal() -> None:
    """It says nothing about DeepSeek's id 0 (its own adapter's flag) or DeepSeek-V4's."""
    deepseek = servable_aux_ids("KimiK25ForConditionalGeneration", 4, "0.34.0",
                                kimi_first_id_copied=True, config=_text(None))
    assert deepseek.low == 1
    v4 = servable_aux_ids("DeepseekV4ForCausalLM", 4, "0.34.0", first_id_repaired=True,
                          kimi_first_id_copied=True)
    assert v4.low == 1
    assert servable_aux_ids(LINEAR, 4, "0.26.0", kimi_first_id_copied=True,
                            config=_text(None)).low == 0


def test_without_the_copy_the_refusal_text_is_unchanged() -> None:
    """``SPECCOMPAT_SKIP=vllm.kimi_linear_first_layer_alias`` (or its probe failing): the
    layer-id adapter passes ``kimi_first_id_copied=False``, the default."""
    copied = servable_aux_ids(LINEAR, 4, "0.34.0", kimi_first_id_copied=True,
                              config=_text(None))
    refused = servable_aux_ids(LINEAR, 4, "0.34.0", kimi_first_id_copied=False,
                               config=_text(None))
    assert refused == servable_aux_ids(LINEAR, 4, "0.34.0", config=_text(None))
    assert copied.low == 0 and refused.low == 1
    with pytest.raises(LayerIdError, match="in-place update instead of the embeddings"):
        refused.check([0, 2, 4], IDS)


class _Target(SimpleNamespace):
    def get_text_config(self) -> SimpleNamespace:
        return self.text_config  # type: ignore[no-any-return]


@pytest.mark.parametrize(("active", "low"), [
    ((), 1),
    (("vllm.kimi_linear_first_layer_alias",), 0),
    (("vllm.deepseek_first_layer_residual", "vllm.deepseek_final_layer_capture"), 1),
])
def test_the_layer_id_check_asks_whether_the_copy_is_applied(
        monkeypatch: pytest.MonkeyPatch, active: tuple[str, ...], low: int) -> None:
    """``checked_slots`` reads the adapters applied in this process (``patching.applied()``,
    where a skipped or failed adapter is not): id 0 passes only with the copy."""
    import sys
    import types

    from speccompat.server.adapters import extract_hidden_states_layer_ids as layer_ids

    monkeypatch.setattr(layer_ids, "applied", lambda: active)
    target = _Target(architectures=[K3], text_config=_text(None))
    # checked_slots reads vllm.__version__; a stand-in, gone again before the test ends.
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.34.0"))
        if low == 0:
            assert layer_ids.checked_slots(target, [0, 4]) == [0, 4]
        else:
            with pytest.raises(LayerIdError, match="in-place update instead of the embeddings"):
                layer_ids.checked_slots(target, [0, 4])
        assert layer_ids.checked_slots(target, [4, 1]) == [1, 4]
