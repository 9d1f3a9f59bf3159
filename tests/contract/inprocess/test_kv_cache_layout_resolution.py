"""The engine core resolves the KV cache layout (vLLM 0.29.0); the generator has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from speccompat.inprocess.adapters.kv_cache_layout_resolution import ID
from support import (
    needs_adapter,
    requires_speculators,
    requires_vllm,
    speculators_generator,
    vllm_in,
)

pytestmark = [requires_vllm, requires_speculators]


@vllm_in(">=0.29.0", "before 0.29.0 the layout is a per-backend default read on demand")
def test_raw_layout_is_unresolved_until_the_engine_core_resolves_it() -> None:
    from vllm.config import CacheConfig
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    config = CacheConfig()
    assert config.kv_cache_layout is None
    with pytest.raises(ValueError, match="has not been resolved yet"):
        config.get_resolved_kv_cache_layout()
    assert callable(resolve_kv_cache_layout)


@needs_adapter(ID)
def test_generator_resolves_like_the_engine(tiny_llama: Path) -> None:
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    import tiny_models

    with speculators_generator(tiny_llama, layer_ids=[1, 3]) as gen:
        real = gen.executor.unwrapped
        config = gen.vllm_config.cache_config
        assert config.kv_cache_layout is not None
        specs = [s for per_worker in real.get_kv_cache_specs() for s in per_worker.values()]
        # What the engine core would choose for these workers (it keeps a resolved layout,
        # so compare with a fresh resolution of the same inputs).
        config.kv_cache_layout, chosen = None, config.kv_cache_layout
        try:
            expected = resolve_kv_cache_layout(gen.vllm_config,
                                               real.get_supported_kv_cache_layouts(), specs)
        finally:
            config.kv_cache_layout = chosen
        assert chosen == expected.name
        out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [21, 4]))
        assert [r["hidden_states"][0].shape[0] for r in out] == [21, 4]


@needs_adapter(ID)
def test_generator_fails_without_it(tiny_llama: Path) -> None:
    unresolved = pytest.raises(ValueError, match="KV cache layout has not been resolved yet")
    with unresolved, speculators_generator(tiny_llama, exclude=(ID,), layer_ids=[1]):
        pass
