"""The server-path catalogue (speculators >= 0.5 through ``vllm serve``): applied by the
plugin inside ``vllm serve`` when the engine is asked for ``extract_hidden_states``.

Ids and module names follow the in-process catalogue's rule (``speccompat.inprocess.adapters``).
Order matters only where two adapters wrap the same consumer name; each wraps what is there,
and ``revert()`` unwinds them in reverse.
"""

from __future__ import annotations

from ...record import Adapter
from . import (
    cpu_runner_aux_layers,
    deepseek_final_layer_capture,
    deepseek_first_layer_residual,
    eagle_mixin_capture_alias,
    extract_hidden_states_layer_ids,
    hidden_states_connector_abort_before_schedule,
    hidden_states_connector_chunked_prefill,
    hidden_states_connector_cpu_writer,
    hidden_states_connector_forward_write_failure,
    hidden_states_connector_group_block_size,
    hidden_states_connector_reply_before_write,
    hidden_states_connector_write_per_step,
    hidden_states_connector_zero_rows,
    hs_connectors_internals_missing,
    kimi_linear_first_layer_alias,
    llama_family_edge_ids,
)

ADAPTERS: tuple[Adapter, ...] = (
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
    kimi_linear_first_layer_alias.ADAPTER,
    deepseek_final_layer_capture.ADAPTER,
    deepseek_first_layer_residual.ADAPTER,
    llama_family_edge_ids.ADAPTER,
    extract_hidden_states_layer_ids.ADAPTER,
)
