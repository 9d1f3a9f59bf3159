"""vLLM's CPU attention takes blocks in multiples of 32 (0.29.0); speculators fixes 16."""

from __future__ import annotations

from pathlib import Path

import pytest

from speccompat.inprocess.adapters.cpu_attention_block_size import ID
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


@vllm_in(">=0.29.0", "before 0.29.0 the CPU attention backend takes multiples of 16")
def test_raw_cpu_attention_wants_multiples_of_32() -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = [getattr(s, "base", s) for s in CPUAttentionBackend.get_supported_kernel_block_sizes()]
    assert sizes == [32], sizes  # MultipleOf(32)


@needs_adapter(ID)
def test_generator_uses_a_block_size_the_cpu_kernels_take(tiny_llama: Path) -> None:
    import tiny_models

    with speculators_generator(tiny_llama, layer_ids=[0, 2]) as gen:
        assert gen.vllm_config.cache_config.block_size == 32
        out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [70, 9]))
        assert [r["hidden_states"][1].shape[0] for r in out] == [70, 9]


@needs_adapter(ID)
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    with pytest.raises(RuntimeError, match="No common block size for 16"):  # noqa: SIM117
        with speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]):
            pass
