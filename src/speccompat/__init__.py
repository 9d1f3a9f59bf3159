"""speccompat: keep EAGLE-3 hidden-state extraction correct across vLLM releases.

    import speccompat
    speccompat.apply()      # before building speculators' VllmHiddenStatesGenerator

``apply()`` returns a :class:`Report`; ``python -m speccompat doctor`` prints it.
"""

from __future__ import annotations

from .errors import (
    AdapterError,
    CorruptCaptureError,
    SpeccompatError,
    SpeccompatWarning,
    UnsupportedConnectorError,
    UnsupportedVersionError,
    UpstreamLimitationError,
    V1RunnerRemovedError,
    VllmNotInstalledError,
    WorkerFailedError,
)
from .inprocess.rpc import collective_rpc
from .layers import (
    LayerIdConvention,
    LayerIdError,
    LayerIdRecord,
    aux_slot_order,
    default_layer_ids,
    hf_hidden_states_index,
    to_speculators_ids,
    to_vllm_aux_ids,
)
from .outcomes import Outcome, Report, State
from .record import Adapter, Side
from .registry import active, apply, catalogue, report, revert
from .versions import Environment, Package, detect

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "AdapterError",
    "CorruptCaptureError",
    "Environment",
    "LayerIdConvention",
    "LayerIdError",
    "LayerIdRecord",
    "Outcome",
    "Package",
    "Report",
    "Side",
    "SpeccompatError",
    "SpeccompatWarning",
    "State",
    "UnsupportedConnectorError",
    "UnsupportedVersionError",
    "UpstreamLimitationError",
    "V1RunnerRemovedError",
    "VllmNotInstalledError",
    "WorkerFailedError",
    "__version__",
    "active",
    "apply",
    "aux_slot_order",
    "catalogue",
    "collective_rpc",
    "default_layer_ids",
    "detect",
    "hf_hidden_states_index",
    "report",
    "revert",
    "to_speculators_ids",
    "to_vllm_aux_ids",
]
