"""The in-process catalogue (speculators 0.3/0.4's generator after ``apply()``): one module
per upstream behaviour, named after it.

A record's id is ``<cause>.<module>``: the lower-case package whose release brought the
behaviour (``vllm`` or ``transformers``; ``speculators`` for its own code, on any vLLM) and
the module's file name; a speculators 0.4.0 mirror kept in the same module adds
``.speculators_0_4``. Each module has its contract test in ``tests/contract/test_<module>.py``.

Order matters only where two adapters wrap the same consumer name; each wraps
what is there, and ``revert()`` unwinds them in reverse.
"""

from __future__ import annotations

from ...record import Adapter
from . import (
    attn_mask_utils_removed,
    chunked_prefill_abort,
    collective_rpc_unique_reply_rank,
    config_dtype_annotation,
    cpu_attention_block_size,
    cpu_mem_get_info,
    execute_model_sample_tokens,
    generator_sample_copy,
    get_hash_fn_by_name_moved,
    kimi_k25_cuda_current_device,
    kimi_k25_unfused_qkv_a_proj,
    kv_cache_layout_resolution,
    kv_cache_planning_moved,
    kv_cache_specs_removed,
    model_forward_drift,
    prefix_caching_default_on,
    request_eos_token_id_removed,
    scheduler_block_size,
    scheduler_config_is_encoder_decoder,
    spawn_after_cuda_init,
    warm_up_not_in_initialize,
)

ADAPTERS: tuple[Adapter, ...] = (
    config_dtype_annotation.ADAPTER,
    attn_mask_utils_removed.ADAPTER,
    collective_rpc_unique_reply_rank.ADAPTER,
    execute_model_sample_tokens.ADAPTER,
    scheduler_block_size.ADAPTER,
    scheduler_config_is_encoder_decoder.ADAPTER,
    kv_cache_layout_resolution.ADAPTER,
    kv_cache_specs_removed.ADAPTER,
    kv_cache_planning_moved.ADAPTER,
    prefix_caching_default_on.ADAPTER,
    request_eos_token_id_removed.ADAPTER,
    cpu_mem_get_info.ADAPTER,
    cpu_attention_block_size.ADAPTER,
    spawn_after_cuda_init.ADAPTER,
    warm_up_not_in_initialize.ADAPTER,
    chunked_prefill_abort.ADAPTER,
    model_forward_drift.ADAPTER,
    model_forward_drift.ADAPTER_V04,
    generator_sample_copy.ADAPTER,
    # speculators 0.4.0 (written for vLLM 0.12-0.16) on vLLM 0.11.x.
    get_hash_fn_by_name_moved.ADAPTER,
    collective_rpc_unique_reply_rank.ADAPTER_V04,
    execute_model_sample_tokens.ADAPTER_V04,
    scheduler_block_size.ADAPTER_V04,
    kv_cache_specs_removed.ADAPTER_V04,
    # vLLM 0.15.x CPU builds: Kimi-K2.5 does not load in the worker.
    kimi_k25_cuda_current_device.ADAPTER,
    kimi_k25_unfused_qkv_a_proj.ADAPTER,
)
