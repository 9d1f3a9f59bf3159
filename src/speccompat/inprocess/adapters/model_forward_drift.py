"""speculators 0.3.0 and 0.4.0 capture by replacing the base model's ``forward`` with a
copy of an old vLLM one, and vLLM's model forward has moved on since:

- 0.11.1 renamed ``get_input_embeddings`` to ``embed_input_ids`` (0.3.0: AttributeError);
- 0.12.0 computes ``llama_4_scaling`` in ``DeepseekV2Model.forward`` and passes it
  to every layer (the copies never do: silently unscaled queries);
- DeepSeek V2/V3 are not ``supports_eagle3`` before 0.18.0 (0.3.0: ValueError), and
  Kimi-K2.5 (0.15.0+) has ``language_model`` and no ``.model`` (0.3.0: AttributeError;
  0.4.0 on 0.15.x, where ``get_language_model()`` is the stack: AttributeError);
- Model Runner V2 (default per architecture from 0.22.0, for all models from 0.29.0 on
  CUDA) has no ``model_runner.input_batch``, which 0.4.0 orders its capture by;
- 0.25.0 all-gathers token-sharded states between DeepSeek layers under
  sequence-parallel MoE, which the copies skip.

Instead of a copied forward, forward hooks on the requested decoder layers capture
``hidden_states + residual`` while vLLM's own forward runs (``speccompat.inprocess.capture``),
per request, and hand each speculators release the reply shape it expects.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import WORKER_EXTENSION, require_in_source
from ...versions import spec
from .. import shm
from ..capture import LayerCapture

ID = "vllm.model_forward_drift"
ID_V04 = "vllm.model_forward_drift.speculators_0_4"


def _setup_for(adapter_id: str) -> Callable[[Any, list[int]], None]:
    # speculators 0.3.0's reply (one tensor per layer id) is written to host memory step
    # by step, while the next step computes; 0.4.0's (one list per request) is copied
    # after the last step.
    stream_to_host = adapter_id == ID

    def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> None:
        previous = getattr(self, "_speccompat_capture", None)
        if previous is not None:
            previous.close()
        self._layer_ids = frozenset(layer_ids)
        self._speccompat_capture = LayerCapture(self, list(layer_ids), adapter_id,
                                                stream_to_host=stream_to_host)

    return _setup_hidden_states_capture


def _reset_capture(self: Any) -> None:
    capture = getattr(self, "_speccompat_capture", None)
    if capture is None:
        raise RuntimeError("Must call _setup_hidden_states_capture before capturing states")
    capture.reset()


def _reset_capture_v04(self: Any) -> None:
    _reset_capture(self)


def _get_captured_states(self: Any) -> list[Any] | None:
    """speculators 0.3.0: one tensor per layer id, the requests' rows in admission order,
    which is the input order the generator slices by."""
    import torch

    capture: LayerCapture | None = getattr(self, "_speccompat_capture", None)
    if capture is None:
        return None
    # Host memory, shared with the driver: pickling CUDA tensors through vLLM's
    # message queue costs more than the forward (docs/results/gpu-results.md).
    streamed = capture.streamed_layers()
    if streamed is not None:
        return streamed
    states = capture.per_request()  # where the slot could not be sized or shm is off
    if states is None:
        return None
    per_layer = [torch.cat(layers, dim=0) for layers in zip(*states.values(), strict=True)]
    return shm.to_host(per_layer)


def _get_captured_states_by_request(self: Any) -> dict[str, list[Any]] | None:
    """speculators 0.4.0: request id -> one tensor per layer id."""
    capture = getattr(self, "_speccompat_capture", None)
    states = None if capture is None else capture.per_request()
    if states is None:
        return None
    # One file per request, each unlinked by its reader: a reused slot is one list per call.
    return {rid: shm.to_host(layers, reuse=False) for rid, layers in states.items()}


def _set_request_metadata(self: Any, request_metadata: dict[str, int]) -> None:
    """speculators 0.4.0 tells the worker each step's prefill counts; the hooks read the
    runner's own batch layout instead, so there is nothing to keep."""


def _probe_v03() -> str | None:
    return require_in_source(
        WORKER_EXTENSION, "base_model.forward = types.MethodType(_patched_forward, base_model)",
        "def _get_captured_states(self)")


def _probe_v04() -> str | None:
    return require_in_source(
        WORKER_EXTENSION, "base_model.forward = types.MethodType(_patched_forward, base_model)",
        "def _set_request_metadata(self", "input_batch.req_id_to_index")


def _patch_v03(patcher: Patcher) -> None:
    def on_extension(module: ModuleType) -> None:
        extension = module.HiddenStatesWorkerExtension
        patcher.replace(extension, "_setup_hidden_states_capture", _setup_for(ID))
        patcher.replace(extension, "_reset_capture", _reset_capture)
        patcher.replace(extension, "_get_captured_states", _get_captured_states)

    patcher.on_import(WORKER_EXTENSION, on_extension)


def _patch_v04(patcher: Patcher) -> None:
    def on_extension(module: ModuleType) -> None:
        extension = module.HiddenStatesWorkerExtension
        patcher.replace(extension, "_setup_hidden_states_capture", _setup_for(ID_V04))
        patcher.replace(extension, "_reset_capture", _reset_capture_v04)
        patcher.replace(extension, "_set_request_metadata", _set_request_metadata)
        patcher.replace(extension, "_get_captured_states", _get_captured_states_by_request)

    patcher.on_import(WORKER_EXTENSION, on_extension)


UPSTREAM = ("vLLM 0.11.1 (get_input_embeddings -> embed_input_ids), 0.12.0 (llama_4_scaling "
            "passed to DeepseekV2DecoderLayer), 0.15.0/0.16.0 (KimiK25 language_model, no "
            ".model), 0.18.0 (DeepSeek supports_eagle3), 0.22.0/0.29.0 (Model Runner V2 "
            "default: no input_batch), 0.25.0 (sequence-parallel MoE all-gather)")

ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's worker captures through decoder-layer hooks while vLLM's own "
    "forward runs, per request, in admission order",
    why="the copied forward drifts with every vLLM release (AttributeError, ValueError, or "
    "silently unscaled or unsharded states); hooks keep vLLM's own forward",
    how="replaces the worker extension's capture methods with forward hooks on the requested "
    "decoder layers (speccompat.inprocess.capture), per request, in admission order",
    upstream=UPSTREAM,
    upstream_ref="none found: a series of model-code changes across releases (listed under "
    "upstream), not one PR",
    vllm=spec(">=0.11.0"),
    speculators=spec("==0.3.*"),
    side=Side.WORKER,
    probe=_probe_v03,
    patch=_patch_v03,
    remove_when="speculators 0.3.0 is no longer supported",
)

ADAPTER_V04 = Adapter(
    id=ID_V04,
    summary="speculators 0.4.0's worker captures through decoder-layer hooks while vLLM's own "
    "forward runs, keyed by request id, in the runner's own batch layout (V1 or V2)",
    why="0.4.0's copied forward drops llama_4_scaling (silently) and orders rows by the V1 "
    "runner's input_batch, which Model Runner V2 does not have",
    how="replaces the worker extension's capture methods with forward hooks on the requested "
    "decoder layers (speccompat.inprocess.capture), keyed by request id",
    upstream=UPSTREAM,
    upstream_ref="none found: a series of model-code changes across releases (listed under "
    "upstream), not one PR",
    vllm=spec(">=0.11.0"),
    speculators=spec("==0.4.*"),
    side=Side.WORKER,
    probe=_probe_v04,
    patch=_patch_v04,
    remove_when="speculators 0.4.0 is no longer supported",
)
