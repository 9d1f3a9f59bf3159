"""guards.py: malformed captures raise CorruptCaptureError; the right structure passes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from speccompat import CorruptCaptureError
from speccompat.inprocess.guards import CaptureExpectation, check_layer_states, versions_text

ADAPTER = "vllm.collective_rpc_unique_reply_rank"


@dataclass(frozen=True)
class FakeTensor:
    """Shape and dtype are all the guard reads (metadata: nothing is synchronised)."""

    shape: tuple[int, ...]
    dtype: str = "bfloat16"


def layers(count: int, rows: int, hidden: int, dtype: str = "bfloat16") -> list[FakeTensor]:
    return [FakeTensor((rows, hidden), dtype) for _ in range(count)]


def check(states: Any, *, n: int = 4, rows: int = 512, hidden: int = 7168,
          dtype: Any = "bfloat16") -> None:
    check_layer_states(states, layers=n, rows=rows, hidden=hidden, dtype=dtype, adapter=ADAPTER)


def test_the_right_structure_passes() -> None:
    check(layers(4, 512, 7168))
    check(tuple(layers(4, 512, 7168)))
    check(layers(1, 1, 8), n=1, rows=1, hidden=8)
    check(layers(4, 512, 7168, "float32"), dtype=None)


def test_the_seed_bug_raises() -> None:
    # speculators 0.3.0 on vLLM >= 0.11.1: [0] of the bare reply, i.e. 771 rows of one layer.
    garbage = [FakeTensor((512,)) for _ in range(771)]
    with pytest.raises(CorruptCaptureError) as caught:
        check(garbage)
    error = caught.value
    assert error.expected == "4 tensors of shape [512, 7168] in bfloat16"
    assert error.found.startswith("771 items")
    assert "[512]" in error.found and "..." in error.found
    message = str(error)
    assert "expected 4 tensors of shape [512, 7168] in bfloat16" in message
    assert "found 771 items" in message
    assert ADAPTER in message
    assert versions_text() in message
    assert "python -m speccompat doctor" in message


def test_wrong_layer_count() -> None:
    with pytest.raises(CorruptCaptureError, match=r"found 3 items \(shapes \[\[512, 7168\]"):
        check(layers(3, 512, 7168))
    with pytest.raises(CorruptCaptureError, match="found 5 items"):
        check(layers(5, 512, 7168))
    with pytest.raises(CorruptCaptureError, match="found 0 items"):
        check([])


def test_wrong_hidden_size() -> None:
    states = [*layers(3, 512, 7168), FakeTensor((512, 4096))]
    with pytest.raises(CorruptCaptureError, match=r"item 3 of shape \[512, 4096\]") as caught:
        check(states)
    assert caught.value.expected == "4 tensors of shape [512, 7168] in bfloat16"


def test_wrong_rows() -> None:
    with pytest.raises(CorruptCaptureError, match=r"item 0 of shape \[511, 7168\]"):
        check(layers(4, 511, 7168))


def test_one_dimensional_tensors() -> None:
    with pytest.raises(CorruptCaptureError, match=r"item 0 of shape \[7168\]"):
        check([FakeTensor((7168,)) for _ in range(4)])


def test_three_dimensional_tensors() -> None:
    with pytest.raises(CorruptCaptureError, match=r"item 0 of shape \[1, 512, 7168\]"):
        check([FakeTensor((1, 512, 7168)) for _ in range(4)])


def test_items_without_a_shape() -> None:
    with pytest.raises(CorruptCaptureError, match=r"item 0 of shape \[\]"):
        check([object() for _ in range(4)])


def test_mixed_dtypes() -> None:
    states = layers(2, 512, 7168) + layers(2, 512, 7168, "float32")
    with pytest.raises(CorruptCaptureError, match="item 2 in float32"):
        check(states)


def test_wrong_dtype_everywhere() -> None:
    with pytest.raises(CorruptCaptureError, match="item 0 in float16"):
        check(layers(4, 512, 7168, "float16"))


def test_mixed_dtypes_without_an_expected_dtype() -> None:
    states = layers(2, 512, 7168) + layers(2, 512, 7168, "float32")
    with pytest.raises(CorruptCaptureError, match="float32"):
        check(states, dtype=None)


@pytest.mark.parametrize(
    ("states", "name"),
    [(None, "NoneType"), (FakeTensor((4, 512, 7168)), "FakeTensor"), ("abcd", "str"),
     (b"abcd", "bytes"), ({0: 1, 1: 2, 2: 3, 3: 4}, "dict"), (iter(range(4)), "range_iterator")],
)
def test_not_a_sequence(states: Any, name: str) -> None:
    with pytest.raises(CorruptCaptureError, match=f"a {name}, not a list of tensors"):
        check(states)


# --------------------------------------------------------------------------- CaptureExpectation


@dataclass
class NewRequest:
    prompt_token_ids: list[int] | None


@dataclass
class SchedulerOutput:
    total_num_scheduled_tokens: int
    scheduled_new_reqs: Sequence[NewRequest] = field(default_factory=list)


class ModelConfig:
    dtype = "bfloat16"

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden

    def get_hidden_size(self) -> int:
        return self.hidden


@dataclass
class VllmConfig:
    model_config: ModelConfig


HIDDEN = 16
CONFIG = VllmConfig(ModelConfig(HIDDEN))


def prompts(*lengths: int) -> list[NewRequest]:
    return [NewRequest(list(range(n))) for n in lengths]


def test_expectation_passes_fully_prefilled_prompts() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ([2, 5, 9],))
    assert capture.layers == 3
    capture.observe_step(SchedulerOutput(10, prompts(4, 6)))
    capture.check(layers(3, 10, HIDDEN), CONFIG)
    # check() starts the next batch from zero.
    assert capture.scheduled_rows == capture.prompt_rows == 0


def test_expectation_over_chunked_steps() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ((1, 2),))
    capture.observe_step(SchedulerOutput(8, prompts(12)))  # first chunk of a 12-token prompt
    capture.observe_step(SchedulerOutput(4, []))  # the rest: not a new request
    capture.check(layers(2, 12, HIDDEN), CONFIG)


def test_expectation_raises_when_a_prompt_was_not_fully_prefilled() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ([1, 2],))
    capture.observe_step(SchedulerOutput(8, prompts(12)))
    with pytest.raises(CorruptCaptureError) as caught:
        capture.check(layers(2, 8, HIDDEN), CONFIG)
    assert caught.value.expected == "every prompt fully prefilled (12 prompt tokens)"
    assert caught.value.found == "8 tokens computed"


def test_expectation_checks_the_structure_against_the_config() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ([1, 2],))
    capture.observe_step(SchedulerOutput(6, prompts(6)))
    with pytest.raises(CorruptCaptureError, match=r"expected 2 tensors of shape \[6, 16\]"):
        capture.check(layers(2, 6, HIDDEN + 1), CONFIG)


def test_expectation_catches_the_seed_bug() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ([1, 2, 3, 4],))
    capture.observe_step(SchedulerOutput(6, prompts(6)))
    with pytest.raises(CorruptCaptureError, match="found 6 items"):
        capture.check([FakeTensor((HIDDEN,)) for _ in range(6)], CONFIG)


def test_expectation_reset_capture_clears_counts() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ([1],))
    capture.observe_step(SchedulerOutput(5, prompts(3)))
    capture.observe_rpc("_reset_capture", ())
    assert capture.scheduled_rows == capture.prompt_rows == 0
    capture.observe_step(SchedulerOutput(4, prompts(4)))
    capture.check(layers(1, 4, HIDDEN), CONFIG)


def test_expectation_without_setup_or_without_work_checks_nothing() -> None:
    not_set_up = CaptureExpectation(ADAPTER)
    not_set_up.observe_step(SchedulerOutput(5, prompts(3)))
    not_set_up.check("garbage", CONFIG)  # capture not set up through this view

    idle = CaptureExpectation(ADAPTER)
    idle.observe_rpc("_setup_hidden_states_capture", ([1],))
    idle.check(None, CONFIG)  # nothing was run


def test_expectation_ignores_other_rpcs_and_empty_prompts() -> None:
    capture = CaptureExpectation(ADAPTER)
    capture.observe_rpc("_setup_hidden_states_capture", ())  # no layer ids: not set up
    capture.observe_rpc("get_kv_cache_spec", ([1, 2, 3],))
    assert capture.layers is None
    capture.observe_rpc("_setup_hidden_states_capture", ([7],))
    capture.observe_step(SchedulerOutput(0, [NewRequest(None)]))
    assert capture.prompt_rows == 0
