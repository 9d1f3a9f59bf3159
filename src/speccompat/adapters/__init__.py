"""The adapter catalogue: one module per upstream behaviour, named after it.

A record's id is ``<cause>.<module>``: the lower-case package whose release brought the
behaviour (``vllm`` or ``transformers``; ``speculators`` for its own code, on any vLLM) and
the module's file name; a speculators 0.4.0 mirror kept in the same module adds
``.speculators_0_4``. Each module has its contract test in ``tests/contract/test_<module>.py``.

Order matters only where two adapters wrap the same consumer name; each wraps
what is there, and ``revert()`` unwinds them in reverse.
"""

from __future__ import annotations

from ..record import Adapter
from . import (
    attn_mask_utils_removed,
    chunked_prefill_abort,
    collective_rpc_unique_reply_rank,
    config_dtype_annotation,
    cpu_attention_block_size,
    cpu_mem_get_info,
    cpu_runner_aux_layers,
    deepseek_final_layer_capture,
    deepseek_first_layer_residual,
    eagle_mixin_capture_alias,
    execute_model_sample_tokens,
    extract_hidden_states_layer_ids,
    generator_sample_copy,
    get_hash_fn_by_name_moved,
    hidden_states_connector_abort_before_schedule,
    hidden_states_connector_chunked_prefill,
    hidden_states_connector_cpu_writer,
    hidden_states_connector_forward_write_failure,
    hidden_states_connector_group_block_size,
    hidden_states_connector_reply_before_write,
    hidden_states_connector_write_per_step,
    hidden_states_connector_zero_rows,
    hs_connectors_internals_missing,
    kimi_k25_cuda_current_device,
    kimi_k25_unfused_qkv_a_proj,
    kv_cache_layout_resolution,
    kv_cache_planning_moved,
    kv_cache_specs_removed,
    llama_family_edge_ids,
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
    # The server path (speculators >= 0.5 through vllm serve): applied by the plugin.
    hidden_states_connector_cpu_writer.ADAPTER,
    cpu_runner_aux_layers.ADAPTER,
    hidden_states_connector_group_block_size.ADAPTER,
    hidden_states_connector_abort_before_schedule.ADAPTER,
    hidden_states_connector_reply_before_write.ADAPTER,
    hidden_states_connector_zero_rows.ADAPTER,
    hidden_states_connector_forward_write_failure.ADAPTER,
    hs_connectors_internals_missing.ADAPTER,
    hidden_states_connector_chunked_prefill.ADAPTER,
    hidden_states_connector_write_per_step.ADAPTER,
    eagle_mixin_capture_alias.ADAPTER,
    deepseek_final_layer_capture.ADAPTER,
    deepseek_first_layer_residual.ADAPTER,
    llama_family_edge_ids.ADAPTER,
    extract_hidden_states_layer_ids.ADAPTER,
)
