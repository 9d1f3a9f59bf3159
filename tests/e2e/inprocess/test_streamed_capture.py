"""speculators 0.3.0's reply written into a shared-memory slot step by step, each step's
rows while the next step computes (``LayerCapture.streamed_layers``): the same tensors as
the copy after the last step, in a reused /dev/shm slot, and the copying way wherever the
slot cannot hold the batch.

Real torch and real files under /dev/shm; the capture's hooks are called as vLLM's V1 runner
calls them (the step's ``num_scheduled_tokens``, its ``input_batch`` order), so no model
runs here. The generator's e2e tests (tests/e2e, tests/gpu) run the same code inside vLLM.
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

import support
from speccompat import CorruptCaptureError
from speccompat.inprocess import shm
from speccompat.inprocess.capture import STREAM_ENV, LayerCapture

torch = pytest.importorskip("torch")

HIDDEN = 16
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    with support.fresh_shm_pool():
        yield


def new_capture(layer_ids: list[int], stream_to_host: bool = True) -> LayerCapture:
    capture = LayerCapture.__new__(LayerCapture)
    capture.adapter = "vllm.model_forward_drift"
    capture.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[]))
    capture._start(layer_ids, recording=True, stream_to_host=stream_to_host)
    return capture


def prompt_states(rid: str, length: int, layer: int, device: str) -> torch.Tensor:
    """What decoder layer ``layer`` gives request ``rid``: distinct for every row."""
    seed = sum(map(ord, rid)) * 1000 + layer * 100
    rows = torch.arange(length, dtype=torch.float32)[:, None] + torch.arange(HIDDEN) / HIDDEN
    return (rows + seed).to(torch.bfloat16).to(device)


class Batch:
    """Steps of one generator batch: which requests are new, and which rows each step
    schedules (the V1 runner's layout: input_batch order, rows in prompt order)."""

    def __init__(self, capture: LayerCapture, prompts: dict[str, int], device: str) -> None:
        self.capture, self.prompts, self.device = capture, prompts, device
        self.done = dict.fromkeys(prompts, 0)

    def step(self, rows: dict[str, int]) -> None:
        capture = self.capture
        new = [SimpleNamespace(req_id=r, prompt_token_ids=[0] * self.prompts[r])
               for r in rows if self.done[r] == 0]
        capture.runner.input_batch.req_ids = list(rows)
        previous = capture.begin_step(
            SimpleNamespace(scheduled_new_reqs=new, num_scheduled_tokens=rows))
        for lid, slot in capture.slots.items():
            parts = [prompt_states(r, self.prompts[r], lid, self.device)[self.done[r]:
                                                                          self.done[r] + n]
                     for r, n in rows.items()]
            value = torch.cat(parts)
            # vLLM's layers return (hidden, residual); the state is their sum.
            residual = torch.ones_like(value)
            capture._hook(slot)(None, (), (value - residual, residual))
        capture.end_step(previous)
        for r, n in rows.items():
            self.done[r] += n

    def expected(self, layer_ids: list[int]) -> list[torch.Tensor]:
        return [torch.cat([prompt_states(r, n, lid, "cpu") for r, n in self.prompts.items()])
                for lid in layer_ids]


def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(
        g.device.type == "cpu" and torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_streamed_reply_is_the_copied_reply_in_a_reused_slot(device: str) -> None:
    layer_ids = [3, 1]  # unsorted: the reply follows the ids as given
    capture = new_capture(layer_ids)
    prompts = {"a": 5, "b": 7, "c": 3}
    batch = Batch(capture, prompts, device)
    batch.step({"a": 5, "b": 3})  # b is chunked over two steps
    batch.step({"b": 4, "c": 3})  # c is admitted after the slot was sized, within headroom
    streamed = capture.streamed_layers()
    assert isinstance(streamed, shm.SharedTensors) and streamed.path.startswith(shm.SHM_DIR)
    assert same(streamed, batch.expected(layer_ids))
    assert same(pickle.loads(pickle.dumps(streamed)), batch.expected(layer_ids))
    assert not capture.chunks, "the capture is reset for the next batch"
    path = streamed.path
    del streamed
    gc.collect()

    again = Batch(capture, prompts, device)
    again.step({"a": 5, "b": 7, "c": 3})
    streamed = capture.streamed_layers()
    assert streamed is not None and streamed.path == path, "a released slot is reused"
    assert same(streamed, again.expected(layer_ids))


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_that_outgrows_its_slot_is_written_whole_into_one_sized_like_the_next(
        device: str) -> None:
    capture = new_capture([0, 2])
    prompts = {"a": 4, "b": 4, "c": 20}
    batch = Batch(capture, prompts, device)
    batch.step({"a": 4})
    batch.step({"b": 4})  # the slot is sized here, for "a" and "b" with headroom
    first = capture.streamed
    assert first is not None and first.capacity < 28
    batch.step({"c": 20})  # admitted later, past it
    assert capture.streamed is None and capture.outgrown
    streamed = capture.streamed_layers()
    assert streamed is not None and same(streamed, batch.expected([0, 2]))
    size = next(s.size for s in shm._pool().slots if s.path == streamed.path)
    del streamed
    gc.collect()

    again = Batch(capture, prompts, device)
    again.step({"a": 4})
    again.step({"b": 4})
    again.step({"c": 20})
    streamed = capture.streamed_layers()
    assert streamed is not None and not capture.outgrown, "sized from the batch before"
    assert same(streamed, again.expected([0, 2]))
    assert [s.size for s in shm._pool().slots] == [size], "the same slot, no new one"


@pytest.mark.parametrize("device", DEVICES)
def test_a_steps_rows_are_written_while_the_next_step_computes(device: str) -> None:
    capture = new_capture([1])
    prompts = {"a": 6, "b": 5}
    batch = Batch(capture, prompts, device)
    batch.step({"a": 6})
    assert capture.streamed is None and len(capture.pending) == 1, "held until the next step"
    batch.step({"b": 5})
    streamed = capture.streamed
    assert streamed is not None and [row for _, row, _ in capture.pending] == [6]
    streamed.wait()
    region = streamed.reservation.storage[shm.HEADER:shm.HEADER + 6 * streamed.row_bytes]
    assert torch.equal(region.view(torch.bfloat16).view(6, HIDDEN),
                       prompt_states("a", 6, 1, "cpu")), "the first step's rows, in place"
    assert same(capture.streamed_layers() or [], batch.expected([1]))


def test_repeated_layer_ids_are_copied() -> None:
    capture = new_capture([2, 2])
    batch = Batch(capture, {"a": 6}, "cpu")
    batch.step({"a": 6})
    assert capture.streamed_layers() is None
    states = capture.per_request()
    assert states is not None and same(states["a"], batch.expected([2, 2]))


def test_a_prompt_not_captured_whole_raises() -> None:
    capture = new_capture([1])
    batch = Batch(capture, {"a": 6, "b": 2}, "cpu")
    batch.step({"a": 4, "b": 2})
    with pytest.raises(CorruptCaptureError, match=r"request a fully prefilled \(6 tokens\)"):
        capture.streamed_layers()


@pytest.mark.parametrize("switch", [shm.SWITCH_ENV, STREAM_ENV])
def test_switched_off_copies_after_the_last_step(monkeypatch: pytest.MonkeyPatch,
                                                 switch: str) -> None:
    """Shared memory off, or the streamed capture off: the copying way."""
    monkeypatch.setenv(switch, "0")
    capture = new_capture([1])
    batch = Batch(capture, {"a": 3}, "cpu")
    batch.step({"a": 3})
    assert capture.streamed_layers() is None
    states = capture.per_request()
    assert states is not None and same(states["a"], batch.expected([1]))


def test_a_reserved_slot_is_not_given_out_until_released() -> None:
    reservation = shm.reserve(4096, for_cuda=False)
    assert reservation is not None
    other = shm.to_host([torch.ones(8)])
    assert other.path != reservation.slot.path
    del other
    gc.collect()
    reservation.release()
    assert shm.to_host([torch.ones(8)]).path in {s.path for s in shm._pool().slots}
    assert reservation.slot.free()
