"""layers.py: old speculators ids (output of layer k) vs vLLM aux ids (input of layer k)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import speccompat
from speccompat import (
    LayerIdConvention,
    LayerIdError,
    LayerIdRecord,
    SpeccompatError,
    default_layer_ids,
    hf_hidden_states_index,
    to_speculators_ids,
    to_vllm_aux_ids,
)
from speccompat.layers import RECORD_FILENAME

OUT = LayerIdConvention.LAYER_OUTPUT
IN = LayerIdConvention.LAYER_INPUT


@st.composite
def output_ids(draw: st.DrawFn) -> tuple[int, list[int]]:
    n = draw(st.integers(1, 200))
    return n, draw(st.lists(st.integers(0, n - 1), max_size=8))


@st.composite
def aux_ids(draw: st.DrawFn) -> tuple[int, list[int]]:
    """Aux ids that have an old speculators equivalent: 1 .. N (0 is the embeddings)."""
    n = draw(st.integers(1, 200))
    return n, draw(st.lists(st.integers(1, n), max_size=8))


@given(output_ids())
def test_output_ids_round_trip(case: tuple[int, list[int]]) -> None:
    n, ids = case
    aux = to_vllm_aux_ids(ids, n)
    assert aux == [k + 1 for k in ids]
    assert all(1 <= a <= n for a in aux)
    assert to_speculators_ids(aux, n) == ids


@given(aux_ids())
def test_aux_ids_round_trip(case: tuple[int, list[int]]) -> None:
    n, ids = case
    old = to_speculators_ids(ids, n)
    assert old == [k - 1 for k in ids]
    assert to_vllm_aux_ids(old, n) == ids


@given(output_ids())
def test_hf_index_is_the_same_entry_in_both_conventions(case: tuple[int, list[int]]) -> None:
    n, ids = case
    for k, a in zip(ids, to_vllm_aux_ids(ids, n), strict=True):
        assert hf_hidden_states_index(k, OUT) == hf_hidden_states_index(a, IN) == k + 1


@given(st.integers(1, 200), st.integers(-5, 5))
def test_out_of_range_ids_raise(n: int, delta: int) -> None:
    bad_old = n + max(delta, 0)  # n, n+1, ... are past the last old id n-1
    bad_neg = min(delta, 0) - 1  # -1, -2, ...
    for bad in (bad_old, bad_neg):
        with pytest.raises(LayerIdError):
            to_vllm_aux_ids([bad], n)
    for bad in (n + 1 + max(delta, 0), bad_neg, 0):
        with pytest.raises(LayerIdError):
            to_speculators_ids([bad], n)


def test_kimi_defaults() -> None:
    old = default_layer_ids(61, OUT)
    assert old == [2, 30, 58, 60]
    assert to_vllm_aux_ids(old, 61) == [3, 31, 59, 61]
    new = default_layer_ids(61, IN)
    assert new == [2, 30, 58, 61]
    # The new default is different data: only the final pre-norm state agrees.
    assert to_speculators_ids(new, 61) == [1, 29, 57, 60]


@given(st.integers(3, 200))
def test_defaults_follow_upstream_and_are_valid(n: int) -> None:
    old, new = default_layer_ids(n, OUT), default_layer_ids(n, IN)
    assert old == [2, n // 2, n - 3, n - 1]
    assert new == [2, n // 2, n - 3, n]
    assert to_vllm_aux_ids(old, n)[-1] == new[-1] == n
    LayerIdRecord(OUT, old, n)  # in range
    LayerIdRecord(IN, new, n)
    if n >= 4:  # every id of the new default has an old equivalent
        to_speculators_ids(new, n)
    else:  # N=3: the new default's N-3 is aux id 0, the embeddings
        with pytest.raises(LayerIdError, match="embeddings"):
            to_speculators_ids(new, n)


def test_small_models() -> None:
    assert default_layer_ids(4, OUT) == [2, 2, 1, 3]  # upstream keeps the repeat
    assert default_layer_ids(3, IN) == [2, 1, 0, 3]
    for n in (1, 2):
        with pytest.raises(LayerIdError, match="Pass the layer ids explicitly"):
            default_layer_ids(n, OUT)
    assert to_vllm_aux_ids([0], 1) == [1]
    assert to_speculators_ids([1], 1) == [0]


def test_out_of_range_message_names_found_range_and_fix() -> None:
    with pytest.raises(LayerIdError) as info:
        to_vllm_aux_ids([2, 30, 70], 61)
    text = str(info.value)
    assert "70" in text and "position 2" in text and "61 decoder layers" in text
    assert "0..60" in text and "output of decoder layer k" in text
    assert "num_hidden_layers" in text
    assert info.value.found and info.value.valid == "0..60 (" + info.value.valid[7:]


def test_an_aux_id_given_as_an_old_id_gets_a_hint() -> None:
    with pytest.raises(LayerIdError, match=r"looks like a vLLM aux id.*old speculators id is 60"):
        to_vllm_aux_ids([2, 30, 58, 61], 61)


def test_aux_id_zero_has_no_old_equivalent() -> None:
    with pytest.raises(LayerIdError) as info:
        to_speculators_ids([3, 0], 61)
    text = str(info.value)
    assert "aux layer id 0 (position 1)" in text and "embeddings" in text
    assert "1..61" in text and "Drop id 0" in text


def test_aux_range_message() -> None:
    with pytest.raises(LayerIdError, match=r"aux layer id 62 .*0\.\.61 \(id k = input"):
        to_speculators_ids([62], 61)


def test_error_is_typed() -> None:
    assert issubclass(LayerIdError, ValueError)
    assert issubclass(LayerIdError, SpeccompatError)
    with pytest.raises(SpeccompatError):
        to_vllm_aux_ids([-1], 4)


@pytest.mark.parametrize("bad", [True, 1.0, "2", None])
def test_non_integer_ids_raise(bad: object) -> None:
    with pytest.raises(LayerIdError, match="an integer"):
        to_vllm_aux_ids([bad], 4)  # type: ignore[list-item]


@pytest.mark.parametrize("n", [0, -3])
def test_bad_layer_counts_raise(n: int) -> None:
    with pytest.raises(LayerIdError, match="num_hidden_layers"):
        to_vllm_aux_ids([], n)
    with pytest.raises(LayerIdError):
        default_layer_ids(n, IN)


def test_conversion_keeps_order_and_repeats() -> None:
    assert to_vllm_aux_ids((3, 1, 3), 4) == [4, 2, 4]
    assert to_vllm_aux_ids(iter([0, 2]), 4) == [1, 3]


def test_hf_index_and_its_final_layer_caveat() -> None:
    assert hf_hidden_states_index(0, OUT) == 1
    assert hf_hidden_states_index(0, IN) == 0  # the embeddings
    assert hf_hidden_states_index(59, OUT, num_layers=61) == 60
    assert hf_hidden_states_index(60, IN, num_layers=61) == 60
    # Without num_layers the final id cannot be recognised; the index is still returned.
    assert hf_hidden_states_index(60, OUT) == 61
    for layer_id, conv in ((60, OUT), (61, IN)):
        with pytest.raises(LayerIdError, match=r"final norm applied.*pre-hook on model.model.norm"):
            hf_hidden_states_index(layer_id, conv, num_layers=61)
    with pytest.raises(LayerIdError, match="out of range"):
        hf_hidden_states_index(62, IN, num_layers=61)
    with pytest.raises(LayerIdError):
        hf_hidden_states_index(-1, OUT)


def test_convention_values() -> None:
    assert OUT.value == "speculators-output"
    assert IN.value == "vllm-aux-input"
    assert LayerIdConvention("vllm-aux-input") is IN
    assert str(OUT) == "speculators-output"


@given(st.sampled_from(list(LayerIdConvention)), st.data())
def test_record_json_round_trip(conv: LayerIdConvention, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 200))
    top = n - 1 if conv is OUT else n
    ids = data.draw(st.lists(st.integers(0, top), max_size=8))
    record = LayerIdRecord(conv, ids, n)
    assert record.layer_ids == tuple(ids)
    again = LayerIdRecord.from_json(record.to_json())
    assert again == record
    assert again.convention is conv


def test_record_validates_and_converts() -> None:
    record = LayerIdRecord(OUT, [2, 30, 58, 60], 61)
    assert record.as_convention(IN) == LayerIdRecord(IN, (3, 31, 59, 61), 61)
    assert record.as_convention(IN).as_convention(OUT) == record
    assert record.as_convention(OUT) is record
    with pytest.raises(LayerIdError, match="looks like a vLLM aux id"):
        LayerIdRecord(OUT, [61], 61)
    with pytest.raises(LayerIdError, match="embeddings"):
        LayerIdRecord(IN, [0, 5], 61).as_convention(OUT)
    coerced = LayerIdRecord("vllm-aux-input", [61], 61)  # type: ignore[arg-type]
    assert coerced.convention is IN


def test_record_json_is_readable() -> None:
    data = json.loads(LayerIdRecord(OUT, [2, 30, 58, 60], 61).to_json())
    assert data["format"] == 1
    assert data["convention"] == "speculators-output"
    assert data["layer_ids"] == [2, 30, 58, 60]
    assert data["num_layers"] == 61
    assert "output of decoder layer k" in data["meaning"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON list"),
        ('{"format": 1, "convention": "vllm-aux-input"}', "without layer_ids, num_layers"),
        ('{"format": 2, "convention": "vllm-aux-input", "layer_ids": [], "num_layers": 4}',
         "format 2"),
        ('{"format": true, "convention": "vllm-aux-input", "layer_ids": [], "num_layers": 4}',
         "format True"),
        ('{"format": 1, "convention": "hf", "layer_ids": [1], "num_layers": 4}',
         "unknown layer-id convention 'hf'"),
        ('{"format": 1, "convention": "vllm-aux-input", "layer_ids": 3, "num_layers": 4}',
         "list of integers"),
        ('{"format": 1, "convention": "vllm-aux-input", "layer_ids": [1.5], "num_layers": 4}',
         "an integer"),
        ('{"format": 1, "convention": "speculators-output", "layer_ids": [4], "num_layers": 4}',
         "out of range"),
    ],
)
def test_malformed_records_raise(text: str, match: str) -> None:
    with pytest.raises(LayerIdError, match=match):
        LayerIdRecord.from_json(text)


def test_record_write_and_read(tmp_path: Path) -> None:
    record = LayerIdRecord(IN, [2, 30, 58, 61], 61)
    path = record.write(tmp_path / "dataset")
    assert path == tmp_path / "dataset" / RECORD_FILENAME
    assert path.read_text().endswith("}\n")
    assert sorted(p.name for p in path.parent.iterdir()) == [RECORD_FILENAME]  # no temp file
    assert LayerIdRecord.read(tmp_path / "dataset") == record
    assert LayerIdRecord.read(path) == record
    LayerIdRecord(OUT, [0], 4).write(path.parent)  # overwrites
    assert LayerIdRecord.read(str(path.parent)) == LayerIdRecord(OUT, (0,), 4)


def test_reading_a_dataset_without_a_record(tmp_path: Path) -> None:
    with pytest.raises(LayerIdError, match=r"no layer-id record.*LAYER_OUTPUT"):
        LayerIdRecord.read(tmp_path)


def test_public_names() -> None:
    for name in ("LayerIdConvention", "LayerIdError", "LayerIdRecord", "aux_slot_order",
                 "default_layer_ids",
                 "hf_hidden_states_index", "to_speculators_ids", "to_vllm_aux_ids"):
        assert name in speccompat.__all__
        assert getattr(speccompat, name) is getattr(speccompat.layers, name)


# --------------------------------------------------------------------------- servable ids


@pytest.mark.parametrize(("architecture", "vllm", "low", "high"), [
    ("LlamaForCausalLM", "0.26.0", 0, 4),
    ("LlamaForCausalLM", "0.17.1", 1, 3),  # 0.17 captures before each layer only
    ("LlamaForCausalLM", "0.18.0+cpu", 0, 4),
    ("Qwen3ForCausalLM", "0.22.0", 0, 4),
    ("DeepseekV3ForCausalLM", "0.22.0", 1, 3),  # no id 0, no final id before 0.25
    ("DeepseekV3ForCausalLM", "0.25.0", 1, 4),
    ("KimiK25ForConditionalGeneration", "0.24.0", 1, 3),
    ("DeepseekV2ForCausalLM", "0.32.0", 1, 4),
    ("DeepseekV3ForCausalLM", "0.33.0", 1, 4),  # its source too (cell 0.33.0 x 0.9.0)
    # DeepseekV4Model: after each layer and the final state, never id 0
    ("DeepseekV4ForCausalLM", "0.34.0", 1, 4),
    ("DeepseekV4ForCausalLM", "0.25.0", 1, 4),
    ("DeepseekV4ForConditionalGeneration", "0.34.0", 1, 4),
    ("DeepseekV41ForCausalLM", "0.34.0", 1, 4),
    # DeepSeek-V3.2: DeepseekV2Model until 0.28; DeepseekV32Model (no final id) from 0.29
    ("DeepseekV32ForCausalLM", "0.28.0", 1, 4),
    ("DeepseekV32ForCausalLM", "0.29.0", 1, 3),
    ("DeepseekV32ForCausalLM", "0.34.0", 1, 3),
])
def test_servable_aux_ids(architecture: str, vllm: str, low: int, high: int) -> None:
    from speccompat.server.servable import servable_aux_ids

    servable = servable_aux_ids(architecture, 4, vllm)
    assert (servable.low, servable.high) == (low, high)
    assert servable.check(list(range(low, high + 1)), "ids") == list(range(low, high + 1))


def test_unservable_ids_name_the_id_and_the_range() -> None:
    from speccompat.layers import LayerIdError
    from speccompat.server.servable import servable_aux_ids

    servable = servable_aux_ids("DeepseekV3ForCausalLM", 4, "0.22.0")
    with pytest.raises(LayerIdError) as error:
        servable.check([1, 2, 4], "eagle_aux_hidden_state_layer_ids")
    text = str(error.value)
    assert "id 4 (position 2) cannot be served" in text
    assert "valid: 1..3" in text and "needs vLLM >= 0.25.0" in text
    assert "id 0 breaks DeepseekV3ForCausalLM's first layer" in text
    with pytest.raises(LayerIdError, match=r"id 0 \(position 0\) cannot be served"):
        servable.check([0, 1], "ids")
    with pytest.raises(LayerIdError, match=r"id 5 \(position 0\) cannot be served"):
        servable_aux_ids("LlamaForCausalLM", 4, "0.26.0").check([5], "ids")
    with pytest.raises(LayerIdError, match="id -1"):
        servable_aux_ids("LlamaForCausalLM", 4, "0.26.0").check([-1], "ids")


def test_ids_out_of_order_or_repeated_give_slots_in_layer_order() -> None:
    """vLLM >= 0.30's rule on every release: each distinct id once, ascending."""
    from speccompat.layers import aux_slot_order
    from speccompat.server.servable import servable_aux_ids

    servable = servable_aux_ids("LlamaForCausalLM", 4, "0.26.0")
    assert servable.check([3, 1, 4], "ids") == [1, 3, 4]
    assert servable.check([1, 2, 2], "ids") == [1, 2]
    assert aux_slot_order([5, 2, 10, 2]) == [2, 5, 10]
    assert aux_slot_order(()) == []
    with pytest.raises(LayerIdError, match="is a str"):
        aux_slot_order([1, "2"])


@pytest.mark.parametrize(("first", "final", "low", "high"), [
    (False, False, 1, 3), (True, False, 0, 3), (False, True, 1, 4), (True, True, 0, 4)])
def test_deepseek_ids_served_once_speccompat_repairs_them(first: bool, final: bool, low: int,
                                                          high: int) -> None:
    from speccompat.server.servable import servable_aux_ids

    servable = servable_aux_ids("DeepseekV3ForCausalLM", 4, "0.22.0",
                                first_id_repaired=first, final_id_repaired=final)
    assert (servable.low, servable.high) == (low, high)


def test_llama_edge_ids_on_0_17_served_once_speccompat_repairs_them() -> None:
    from speccompat.server.servable import servable_aux_ids

    repaired = servable_aux_ids("LlamaForCausalLM", 4, "0.17.1", first_id_repaired=True,
                                final_id_repaired=True)
    assert (repaired.low, repaired.high, repaired.limits) == (0, 4, ())
    # The flags mean nothing where vLLM serves 0..N itself.
    assert servable_aux_ids("LlamaForCausalLM", 4, "0.26.0", first_id_repaired=False,
                            final_id_repaired=False).low == 0


@pytest.mark.parametrize("architecture", ["DeepseekV4ForCausalLM",
                                          "DeepseekV4ForConditionalGeneration",
                                          "DeepseekV41ForCausalLM"])
@pytest.mark.parametrize("vllm", ["0.25.0", "0.33.0", "0.34.0"])
def test_deepseek_v4_never_serves_id_0_whatever_speccompat_repairs(architecture: str,
                                                                     vllm: str) -> None:
    """DeepseekV4Model captures after each layer only; the first-layer adapter patches
    DeepseekV2Model, not it, so its flag must not open id 0 (the server would die at the
    first request with one state fewer than asked)."""
    from speccompat.layers import LayerIdError
    from speccompat.server.servable import servable_aux_ids

    for first, final in ((False, False), (True, True)):
        servable = servable_aux_ids(architecture, 4, vllm, first_id_repaired=first,
                                    final_id_repaired=final)
        assert (servable.low, servable.high) == (1, 4)
        assert servable.check([1, 4], "ids") == [1, 4]
        with pytest.raises(LayerIdError) as error:
            servable.check([0, 2], "eagle_aux_hidden_state_layer_ids")
        text = str(error.value)
        assert "id 0 (position 0) cannot be served" in text and "valid: 1..4" in text
        assert f"id 0 is never captured by {architecture}" in text
        assert "after each layer only" in text


def test_deepseek_v2_stack_still_serves_id_0_once_repaired() -> None:
    """Only DeepseekV2Model's architectures follow the first-layer adapter's flag."""
    from speccompat.server.servable import servable_aux_ids

    for architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                         "KimiK25ForConditionalGeneration", "DeepseekV32ForCausalLM"):
        repaired = servable_aux_ids(architecture, 4, "0.34.0", first_id_repaired=True)
        assert repaired.low == 0, architecture
        assert servable_aux_ids(architecture, 4, "0.34.0").low == 1, architecture


@pytest.mark.parametrize(("vllm", "high"), [("0.24.0", 4), ("0.28.0", 4), ("0.29.0", 3),
                                            ("0.34.0", 3)])
def test_deepseek_v32_final_id_follows_its_model_class(vllm: str, high: int) -> None:
    """Until 0.28 DeepseekV32ForCausalLM is DeepseekV2Model's DeepseekV3ForCausalLM (final id
    repaired before 0.25 by deepseek_final_layer_capture); from 0.29.0 CUDA and ROCm run
    DeepseekV32Model, which never captures the final state, whatever the flag says."""
    from speccompat.server.servable import servable_aux_ids

    servable = servable_aux_ids("DeepseekV32ForCausalLM", 4, vllm, first_id_repaired=True,
                                final_id_repaired=True)
    assert (servable.low, servable.high) == (0, high)
    if high == 3:
        assert "never captured by DeepseekV32ForCausalLM's DeepseekV32Model" in \
            "; ".join(servable.limits)
