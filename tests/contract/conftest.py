"""Contract tests: the raw upstream behaviour pinned, and speccompat's normalized one.

Each file is named after its adapter and runs the real vLLM and speculators
code; the normalized half fails if its adapter is removed.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from packaging.version import Version


@pytest.fixture(scope="session")
def generator_module() -> ModuleType:
    """speculators' generator module, imported once (it imports vLLM and transformers) by
    ``support.import_generator_module``, which applies only the adapters its import needs;
    those adapters' own contract tests import it without them, in a fresh process."""
    from support import import_generator_module

    return import_generator_module()


@pytest.fixture(scope="session")
def vllm_config(tiny_llama):  # type: ignore[no-untyped-def]
    """The VllmConfig speculators 0.3.0 builds, written out with the installed vLLM's
    required arguments."""
    import inspect

    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    # vLLM 0.11.1 added is_encoder_decoder (required from 0.12.0).
    decoder_only = ({"is_encoder_decoder": False}
                    if "is_encoder_decoder" in inspect.signature(SchedulerConfig).parameters
                    else {})
    return VllmConfig(
        model_config=ModelConfig(model=str(tiny_llama), tokenizer=str(tiny_llama),
                                 dtype="auto", max_model_len=1024, enforce_eager=True),
        cache_config=CacheConfig(block_size=16, enable_prefix_caching=False),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        scheduler_config=SchedulerConfig(max_num_seqs=32, max_model_len=1024,
                                         max_num_batched_tokens=1024, **decoder_only),
        device_config=DeviceConfig(),
        load_config=LoadConfig(),
    )


@pytest.fixture(scope="session")
def kv_cache_groups(vllm_config):  # type: ignore[no-untyped-def]
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_spec
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    specs = {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16) for i in range(4)}
    cache_config = vllm_config.cache_config
    if hasattr(cache_config, "get_resolved_kv_cache_layout") and (
            cache_config.kv_cache_layout is None):
        # vLLM 0.29.0+: the engine core resolves the layout before anything plans the cache
        # (here, before any test plans it: a test must not depend on another having run);
        # no worker reports its backends here, so the default preference decides.
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )

        names = [layout.name for layout in get_supported_kv_cache_layouts([])]
        resolve_kv_cache_layout(vllm_config, [names], specs.values())
    return specs, _get_kv_cache_groups_uniform_spec(specs)


@pytest.fixture
def kv_cache_config(vllm_config, kv_cache_groups):  # type: ignore[no-untyped-def]
    import inspect

    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    specs, groups = kv_cache_groups
    if "kv_cache_specs" in inspect.signature(get_kv_cache_config_from_groups).parameters:
        config = get_kv_cache_config_from_groups(vllm_config, groups, specs, 64 << 20)  # 0.11.x
    else:
        config = get_kv_cache_config_from_groups(vllm_config, groups, 64 << 20)
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks  # as speculators does
    return config


# --- one extraction path per cell -------------------------------------------------------
# The folder says the path: tests/contract/inprocess/ runs in the cells of speculators
# 0.3.0/0.4.0, tests/contract/server/ in those of speculators 0.5.0-0.9.0. Every vLLM release
# from 0.17.0 has cells of both, so each module still runs on each release; facts/ (no
# adapter) runs everywhere. Where apply() refuses the in-process path (vLLM 0.34.0 deleted the
# V1 model runner: registry.in_process_refusal, read from the installed files), no in-process
# adapter can apply, and tests/contract/inprocess/ skips with the refusal as its reason;
# facts/test_v1_runner_present.py pins the refusal itself.
FOLDER_PATHS = {"inprocess": "in-process", "server": "server"}
REFUSAL_PINNED_BY = "tests/contract/facts/test_v1_runner_present.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import speccompat
    from speccompat import matrix, registry

    env = speccompat.detect()
    if env.speculators is None or env.vllm is None or env.vllm.version < Version(
            matrix.FIRST_SERVER_VLLM):
        return
    here = matrix.path_of(env.speculators.version)
    refusal = registry.in_process_refusal(env) if here == matrix.IN_PROCESS else None
    for item in items:
        path = FOLDER_PATHS.get(item.path.parent.name)
        if refusal is not None and path == here:
            item.add_marker(pytest.mark.skip(reason=(
                f"apply() refuses the in-process path here, so no in-process adapter applies: "
                f"{registry.V1_RUNNER_GONE} (the refusal is pinned by {REFUSAL_PINNED_BY})")))
        elif path is not None and path != here:
            other = ("speculators 0.5.0-0.9.0" if path == "server"
                     else "speculators 0.3.0/0.4.0")
            item.add_marker(pytest.mark.skip(reason=(
                f"{path} path's contract: checked in the {path} cells ({other}) of vLLM "
                f"{env.vllm.version}; this cell has speculators {env.speculators.version}")))
