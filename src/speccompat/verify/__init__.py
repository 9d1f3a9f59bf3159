"""``python -m speccompat verify DIR``: check hidden-state extraction outputs on disk.

Two layouts are understood:

* speculators 0.3/0.4 offline data generation: ``DIR/data_{i}.pt``, each a
  ``torch.save`` of ``{"input_ids": [seq_len], "hidden_states": [[seq_len, hidden]
  per layer], "loss_mask": [seq_len] or None}``, with an optional
  ``DIR/data_config.json`` (speculators' ``DataGenerationConfig``);
* speculators >= 0.5 / vLLM's ``ExampleHiddenStatesConnector``:
  ``DIR/hs_{i}.safetensors`` or ``*.safetensors`` in ``DIR`` or
  ``DIR/hidden_states/``, each holding ``hidden_states`` ``[num_tokens, num_layers,
  hidden]`` and ``token_ids`` ``[num_tokens]``.

Given ``--layer-ids`` (what the server was asked for) and ``--model``, id 0's slot is
compared with the model's embedding rows (``verify.embeddings``).

``.pt`` files are read with ``torch.load(..., weights_only=True)`` and nothing
else: a file that needs more than tensors and plain containers is reported, never
unpickled. This package imports neither torch nor safetensors at import time.
"""

from .check import verify_dir
from .layout import HIDDEN_STATES_SUBDIR, discover, find_gaps, index_of
from .metadata import (
    DATA_CONFIG,
    SAMPLE_LENGTHS,
    Metadata,
    hidden_size_from_config,
    model_hidden_size,
    read_metadata,
)
from .readers import SEED_BUG_ADAPTER, TorchMissingError
from .report import Expected, FileResult, Format, Gap, SampleFile, Status, VerifyReport

__all__ = [
    "DATA_CONFIG",
    "HIDDEN_STATES_SUBDIR",
    "SAMPLE_LENGTHS",
    "SEED_BUG_ADAPTER",
    "Expected",
    "FileResult",
    "Format",
    "Gap",
    "Metadata",
    "SampleFile",
    "Status",
    "TorchMissingError",
    "VerifyReport",
    "discover",
    "find_gaps",
    "hidden_size_from_config",
    "index_of",
    "model_hidden_size",
    "read_metadata",
    "verify_dir",
]
