"""The adapter catalogue: one module per upstream behaviour, named after it.

Order matters only where two adapters wrap the same consumer name; each wraps
what is there, and ``revert()`` unwinds them in reverse.
"""

from __future__ import annotations

from ..registry import Adapter
from . import (
    chunked_prefill_abort,
    collective_rpc_unique_reply_rank,
    cpu_mem_get_info,
    execute_model_sample_tokens,
    kv_cache_config_from_groups,
    model_forward_drift,
    prefix_caching_default_on,
    request_eos_token_id_removed,
    scheduler_block_size,
    scheduler_config_is_encoder_decoder,
    speculators_transformers5_import,
)

ADAPTERS: tuple[Adapter, ...] = (
    speculators_transformers5_import.ADAPTER,
    collective_rpc_unique_reply_rank.ADAPTER,
    execute_model_sample_tokens.ADAPTER,
    scheduler_block_size.ADAPTER,
    scheduler_config_is_encoder_decoder.ADAPTER,
    kv_cache_config_from_groups.ADAPTER,
    prefix_caching_default_on.ADAPTER,
    request_eos_token_id_removed.ADAPTER,
    cpu_mem_get_info.ADAPTER,
    chunked_prefill_abort.ADAPTER,
    model_forward_drift.ADAPTER,
    model_forward_drift.ADAPTER_V04,
)
