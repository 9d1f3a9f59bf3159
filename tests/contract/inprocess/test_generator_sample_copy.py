"""speculators 0.3.0's generate() copies each sample's rows on the driver; with speccompat,
each sample gets a storage of its own over the shared-memory hand-over instead."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from speccompat import registry
from speccompat.inprocess import shm
from speccompat.inprocess.adapters.generator_sample_copy import ID, UPSTREAM_GENERATE_SHA256, _probe
from speccompat.inprocess.adapters.generator_sample_copy import (
    upstream_generate_sha256 as installed,
)
from support import (
    needs_adapter,
    requires_generator,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    speculators_in,
)

pytestmark = [requires_vllm, requires_speculators, requires_generator]

LAYER_IDS = [1, 2]
LENGTHS = [12, 30, 7]


def mapped_file(address: int) -> str:
    """The file behind the mapping that holds ``address`` in this process ("" if none)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return rest[4].strip() if len(rest) == 5 else ""
    raise LookupError(f"address {address:#x} is not mapped")


def extract(model: Path, batches: list[list[int]], exclude: tuple[str, ...] = ()
            ) -> list[list[dict[str, Any]]]:
    with speculators_generator(model, exclude=exclude, layer_ids=LAYER_IDS) as generator:
        return [generator.generate(batch) for batch in batches]


@pytest.fixture(scope="module")
def prompts() -> list[list[list[int]]]:
    import tiny_models

    return [tiny_models.make_prompts(tiny_models.VOCAB_SIZE, LENGTHS, seed=seed)
            for seed in (0, 1, 2)]


@speculators_in("==0.3.*", "only speculators 0.3.0's generate() slices and copies")
def test_raw_generate_is_the_released_one_that_copies() -> None:
    assert installed() == UPSTREAM_GENERATE_SHA256
    assert _probe() is None


@needs_adapter(ID, "its generate() is another")
def test_raw_generate_copies_every_sample(tiny_llama: Path, prompts: Any) -> None:
    (batch,) = extract(tiny_llama, prompts[:1], exclude=(ID,))
    for sample in batch:
        for layer in sample["hidden_states"]:
            # Copied into the driver's own memory, not the worker's shared-memory slot.
            assert not mapped_file(layer.data_ptr()).startswith(shm.SHM_DIR)


@needs_adapter(ID, "its generate() is another")
def test_samples_own_the_handed_over_memory(tiny_llama: Path, prompts: Any) -> None:
    import torch

    (copied,) = extract(tiny_llama, prompts[:1], exclude=(ID,))
    kept, *later = extract(tiny_llama, prompts, exclude=())
    assert [len(b) for b in later] == [len(LENGTHS)] * 2  # two batches after the kept one
    for ours, theirs, length in zip(kept, copied, LENGTHS, strict=True):
        assert torch.equal(ours["input_ids"], theirs["input_ids"]) and ours["loss_mask"] is None
        assert len(ours["hidden_states"]) == len(LAYER_IDS)
        for layer, reference in zip(ours["hidden_states"], theirs["hidden_states"], strict=True):
            # Bit for bit what upstream's copy gives, after two later batches.
            assert layer.shape == reference.shape and layer.shape[0] == length
            assert torch.equal(layer, reference)
            # No copy: the worker's shared-memory slot, as a storage of the sample's own.
            assert mapped_file(layer.data_ptr()).startswith(f"{shm.SHM_DIR}/{shm.PREFIX}")
            nbytes = layer.numel() * layer.element_size()
            assert layer.untyped_storage().nbytes() == nbytes
            saved = io.BytesIO()
            torch.save(layer, saved)
            assert nbytes <= len(saved.getvalue()) < nbytes + 4096  # the sample, not the batch


def test_own_storage_shares_and_outlives_its_source() -> None:
    import torch

    batch = torch.arange(60, dtype=torch.bfloat16).reshape(10, 6)
    owned = shm.own_storage(batch[3:5])
    assert owned.data_ptr() == batch[3:5].data_ptr()
    assert owned.untyped_storage().nbytes() == 2 * 6 * 2
    expected = batch[3:5].clone()
    del batch
    assert torch.equal(owned, expected)
    # Nothing to share: an empty or strided slice is copied.
    grid = torch.zeros(4, 4)
    assert shm.own_storage(grid[:, 1]).untyped_storage().nbytes() == 4 * 4
    assert shm.own_storage(grid[:0]).numel() == 0


@needs_adapter(ID, "its generate() is another")
def test_revert_restores_upstreams_generate(generator_module: Any) -> None:
    import speccompat
    from speccompat.patching import patched_by

    upstream = generator_module.VllmHiddenStatesGenerator.generate
    registry._apply(sides=(speccompat.Side.DRIVER,))
    try:
        assert patched_by(generator_module.VllmHiddenStatesGenerator.generate) == ID
    finally:
        speccompat.revert()
    assert generator_module.VllmHiddenStatesGenerator.generate is upstream
