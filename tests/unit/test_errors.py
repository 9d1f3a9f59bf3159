"""Errors raised in a vLLM worker reach the driver pickled: every one must survive that."""

from __future__ import annotations

import pickle

import pytest

from speccompat.errors import (
    AdapterError,
    CorruptCaptureError,
    SpeccompatError,
    UnsupportedVersionError,
    VllmNotInstalledError,
    WorkerFailedError,
)

ERRORS = [
    SpeccompatError("plain"),
    VllmNotInstalledError(),
    UnsupportedVersionError("vLLM 0.99.0", "vLLM 0.16.0", "pin it"),
    AdapterError("vllm.some.adapter", "probe disagrees"),
    CorruptCaptureError("4 tensors [512, 7168]", "771 tensors [512]", versions="vLLM 0.16.0",
                        adapter="vllm.collective_rpc_unique_reply_rank"),
    WorkerFailedError("worker 0 raised"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_round_trips_through_pickle(error: SpeccompatError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back) == vars(error)


def test_fields_survive() -> None:
    error = CorruptCaptureError("a", "b", versions="v", adapter="x")
    back = pickle.loads(pickle.dumps(error))
    assert (back.expected, back.found) == ("a", "b")
