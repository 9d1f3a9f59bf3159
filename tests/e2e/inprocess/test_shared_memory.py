"""Captured states reach the driver through a shared-memory slot that the worker reuses
only once nobody maps it: a consumer that keeps tensors never sees them overwritten.
Real torch, real files under /dev/shm, a second process as the reader."""

from __future__ import annotations

import gc
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from speccompat.inprocess import shm

torch = pytest.importorskip("torch")

# A reader in another process: maps the payload, reports a checksum, holds the tensors
# until told to drop them, then reports again.
READER = """
import pickle, sys
states = pickle.loads(open(sys.argv[1], "rb").read())
print(float(sum(s.float().sum() for s in states)), flush=True)
sys.stdin.readline()
print(float(sum(s.float().sum() for s in states)), flush=True)
del states
print("dropped", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    with support.fresh_shm_pool():
        yield


def batch(seed: float, rows: int = 300) -> list[torch.Tensor]:
    return [torch.full((rows, 64), seed, dtype=torch.bfloat16),
            torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8) + seed]


def total(states: list[torch.Tensor]) -> float:
    return float(sum(s.float().sum() for s in states))


def test_round_trip_and_reuse_once_released() -> None:
    first = shm.to_host(batch(1.0))
    assert isinstance(first, shm.SharedTensors) and first.path.startswith(shm.SHM_DIR)
    got = pickle.loads(pickle.dumps(first))
    assert all(torch.equal(a, b) for a, b in zip(got, batch(1.0), strict=True))
    path = first.path
    del first, got
    second = shm.to_host(batch(2.0))
    assert second.path == path, "a released slot is reused"
    assert total(second) == total(batch(2.0))


def test_kept_tensors_are_never_overwritten_in_process() -> None:
    kept = shm.to_host(batch(1.0))  # an in-process consumer that keeps its list
    other = shm.to_host(batch(2.0))
    assert other.path != kept.path
    assert total(kept) == total(batch(1.0))


def test_handed_over_but_not_yet_mapped_is_busy() -> None:
    sent = shm.to_host(batch(1.0))
    path = sent.path
    payload = pickle.dumps(sent)
    del sent  # the worker drops its list once the reply is sent
    while_in_flight = shm.to_host(batch(2.0))
    assert while_in_flight.path != path
    got = pickle.loads(payload)
    assert total(got) == total(batch(1.0))


def test_a_reader_process_holds_its_slot(tmp_path: Path) -> None:
    sent = shm.to_host(batch(1.0))
    held_path = sent.path
    (tmp_path / "payload").write_bytes(pickle.dumps(sent))
    del sent
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(READER),
                               str(tmp_path / "payload")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert reader.stdin is not None and reader.stdout is not None
    try:
        assert float(reader.stdout.readline()) == total(batch(1.0))
        while_held = shm.to_host(batch(5.0))
        assert while_held.path != held_path
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert float(reader.stdout.readline()) == total(batch(1.0)), "the reader's data changed"
        assert reader.stdout.readline().strip() == "dropped"
        del while_held
        after = shm.to_host(batch(6.0))
        assert after.path == held_path, "released by the reader: reused"
    finally:
        reader.stdin.write("\n")
        reader.stdin.close()
        reader.wait(timeout=60)


def test_a_reader_gets_a_handed_over_list_it_may_keep() -> None:
    got = pickle.loads(pickle.dumps(shm.to_host(batch(1.0))))
    assert isinstance(got, shm.HandedOver)
    rows = shm.own_storage(got[0][10:20])  # what speculators 0.3.0's samples get
    assert rows.untyped_storage().nbytes() == 10 * 64 * 2
    del got
    gc.collect()
    shm.to_host(batch(2.0))  # the slot is still mapped by ``rows``: a new one is written
    assert float(rows.float().sum()) == 10 * 64 * 1.0


def test_only_two_slots_are_page_locked() -> None:
    kept = [shm.to_host(batch(float(n))) for n in range(4)]  # a consumer keeping every batch
    pool = shm._POOL
    assert pool is not None and len(pool.slots) == 4
    assert [s.may_pin for s in pool.slots] == [True, True, False, False]
    assert [total(k) for k in kept] == [total(batch(float(n))) for n in range(4)]


class _RefusingCudart:
    """torch.cuda.cudart() of a host whose driver refuses to page-lock (the CPU machines of
    these tests have no CUDA to refuse)."""

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        return 2  # cudaErrorMemoryAllocation


@pytest.fixture
def speccompat_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The warnings of speccompat's logger, caught on the logger itself: vLLM's logging
    setup, where an earlier test imported vLLM, stops them before the root logger."""
    monkeypatch.setattr(shm, "_unpinned_warned", False)
    caught: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: caught.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("vllm.speccompat")
    logger.addHandler(handler)
    try:
        yield caught
    finally:
        logger.removeHandler(handler)


def test_a_slot_left_pageable_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                           speccompat_warnings: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "cudart", _RefusingCudart)
    pool = shm._pool()
    refused = pool.slot_for(1 << 20)
    assert refused is not None
    refused.reserved = True  # taken, so the next call makes a second slot
    unlockable = pool.slot_for(1 << 20)
    assert unlockable is not None and unlockable is not refused
    unlockable.may_pin = False  # as a third slot beside two held ones
    refused.pin()
    refused.pin()
    unlockable.pin()
    assert refused.pinned_at is None and unlockable.pinned_at is None
    assert len(speccompat_warnings) == 1, speccompat_warnings
    assert "CUDA error 2" in speccompat_warnings[0]
    assert "extraction is slower" in speccompat_warnings[0]


def test_a_slot_beyond_the_page_locked_two_names_its_reason(
        speccompat_warnings: list[str]) -> None:
    slot = shm._pool().slot_for(1 << 20)
    assert slot is not None
    slot.may_pin = False
    slot.pin()
    assert len(speccompat_warnings) == 1 and "hold the page locks" in speccompat_warnings[0]


def test_a_slot_too_small_gives_its_page_lock_to_the_new_one() -> None:
    small = shm.to_host(batch(1.0, rows=10))
    del small
    kept = shm.to_host(batch(2.0, rows=300))  # a consumer that keeps this batch ...
    bigger = shm.to_host(batch(3.0, rows=5000))  # ... while a bigger one is made
    pool = shm._POOL
    assert pool is not None and [s.may_pin for s in pool.slots] == [True, True]
    assert total(kept) == total(batch(2.0, rows=300))
    assert total(bigger) == total(batch(3.0, rows=5000))


def test_grows_and_keeps_few_free_slots() -> None:
    small = shm.to_host(batch(1.0, rows=10))
    small_path = small.path
    del small
    big = shm.to_host(batch(1.0, rows=5000))
    big_path = big.path
    assert big_path != small_path and total(big) == total(batch(1.0, rows=5000))
    del big
    for rows in (20, 6000, 7000, 8000):  # each too big for the last: a new slot each time
        shm.to_host(batch(1.0, rows=rows))
    pool = shm._POOL
    assert pool is not None and len(pool.slots) == 1, "slots too small are closed"
    again = shm.to_host(batch(3.0, rows=4000))
    assert again.path in {s.path for s in pool.slots}
    assert total(again) == total(batch(3.0, rows=4000))


def test_files_are_removed_when_the_pool_closes() -> None:
    sent = shm.to_host(batch(1.0))
    path = sent.path
    del sent
    assert os.path.exists(path)
    assert shm._POOL is not None
    shm._POOL.close()
    assert not os.path.exists(path)


def test_orphans_of_dead_workers_are_removed() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = os.path.join(shm.SHM_DIR, f"{shm.PREFIX}{dead.stdout.strip()}-0123abcd")
    mine = os.path.join(shm.SHM_DIR, f"{shm.PREFIX}{os.getpid()}-4567ef")
    for path in (orphan, mine):
        Path(path).write_bytes(b"x")
    try:
        shm.to_host(batch(1.0))  # the pool's first use sweeps
        assert not os.path.exists(orphan)
        assert os.path.exists(mine)
    finally:
        for path in (orphan, mine):
            if os.path.exists(path):
                os.unlink(path)


def test_fresh_file_route_is_unlinked_by_its_reader() -> None:
    sent = shm.to_host(batch(1.0), reuse=False)
    path = sent.path
    got = pickle.loads(pickle.dumps(sent))
    assert not os.path.exists(path)
    assert total(got) == total(batch(1.0))


def test_switched_off_sends_plain_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shm.SWITCH_ENV, "0")
    out = shm.to_host(batch(1.0))
    assert not isinstance(out, shm.SharedTensors)
    assert total(out) == total(batch(1.0))
