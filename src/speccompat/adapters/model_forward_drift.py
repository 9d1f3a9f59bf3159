"""speculators 0.3.0 captures by replacing the base model's ``forward`` with a copy of
vLLM 0.11.0's, and vLLM's model forward has moved on since:

- 0.11.1 renamed ``get_input_embeddings`` to ``embed_input_ids`` (AttributeError);
- 0.12.0 computes ``llama_4_scaling`` in ``DeepseekV2Model.forward`` and passes it
  to every layer (the copy never does: silently unscaled queries);
- DeepSeek V2/V3 are not ``supports_eagle3`` before 0.18.0, and Kimi-K2.5 (0.15.0+)
  has ``language_model`` and no ``.model`` (ValueError / AttributeError).

Instead of a copied forward, forward hooks on the requested decoder layers
capture ``hidden_states + residual`` while vLLM's own forward runs, so every
argument vLLM passes reaches the layers. The capture is kept per request and
returned in the order the requests were admitted, which is the input order
the generator slices by, also when chunked prefill spreads a prompt over steps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .. import guards, shm
from ..errors import CorruptCaptureError
from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import WORKER_EXTENSION, decoder_stack, require_in_source
from ..versions import spec

ID = "vllm.model.forward_drift"


class LayerCapture:
    """Forward hooks on decoder layers of one worker, and what they captured per request."""

    def __init__(self, worker: Any, layer_ids: list[int]) -> None:
        from vllm.distributed import get_pp_group, get_tp_group

        if get_pp_group().world_size > 1:
            raise NotImplementedError(
                "hidden-state capture with pipeline parallelism: the generator asks rank 0 only, "
                "which does not hold every layer; use tensor parallelism")
        self.runner = worker.model_runner
        stack = decoder_stack(self.runner.get_model())
        num_layers = len(stack.layers)
        bad = [i for i in layer_ids if not 0 <= int(i) < num_layers]
        if bad:
            raise ValueError(
                f"layer ids {bad} out of range: the model has layers 0..{num_layers - 1}")
        self.layer_ids = [int(i) for i in layer_ids]
        self.slots = {lid: n for n, lid in enumerate(sorted(set(self.layer_ids)))}
        self.recording = get_tp_group().rank_in_group == 0
        self.handles = [
            stack.layers[lid].register_forward_hook(self._hook(slot))
            for lid, slot in self.slots.items()
        ]
        self.step: Any = None
        self.layout: list[tuple[str, int]] | None = None
        self.reset()
        self._wrap_runner()

    def reset(self) -> None:
        self.chunks: dict[str, list[list[Any]]] = {}
        self.prompt_lengths: dict[str, int] = {}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.runner.__dict__.pop("execute_model", None)

    def _wrap_runner(self) -> None:
        runner_execute = type(self.runner).execute_model.__get__(self.runner)

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self._admit(scheduler_output)
            self.step, self.layout = scheduler_output, None
            try:
                return runner_execute(scheduler_output, *args, **kwargs)
            finally:
                self.step = self.layout = None

        # Only this runner instance: warm-up and profiling runs (no step) capture nothing.
        self.runner.execute_model = execute_model

    def _admit(self, scheduler_output: Any) -> None:
        # Scheduled in FCFS order, which is the order the generator added them in.
        for new in scheduler_output.scheduled_new_reqs:
            self.prompt_lengths[new.req_id] = len(new.prompt_token_ids or ())
            self.chunks[new.req_id] = [[] for _ in self.slots]

    def _batch_layout(self) -> list[tuple[str, int]]:
        # The V1 model runner lays tokens out in input_batch order (gpu_model_runner.py).
        batch = getattr(self.runner, "input_batch", None)
        if batch is None:
            raise NotImplementedError(
                "this model runner has no input_batch (Model Runner V2); "
                "set VLLM_USE_V2_MODEL_RUNNER=0")
        counts = self.step.num_scheduled_tokens
        return [(rid, int(counts[rid])) for rid in batch.req_ids if rid is not None]

    def _hook(self, slot: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if self.step is None or not self.recording:
                return
            if not (isinstance(output, tuple) and len(output) == 2):
                raise TypeError(
                    f"{type(module).__name__} returned {type(output).__name__}, "
                    "expected (hidden_states, residual)")
            hidden, residual = output
            value = hidden if residual is None else hidden + residual
            if self.layout is None:
                self.layout = self._batch_layout()
            sizes = [n for _, n in self.layout]
            if value.shape[0] < sum(sizes):
                raise CorruptCaptureError(
                    f"{sum(sizes)} rows from decoder layer", f"{value.shape[0]} rows "
                    "(token-sharded layer output, e.g. sequence-parallel MoE)",
                    versions=guards.versions_text(), adapter=ID)
            for (rid, _), chunk in zip(self.layout, value[: sum(sizes)].split(sizes), strict=True):
                self.chunks[rid][slot].append(chunk)

        return hook

    def results(self) -> list[Any] | None:
        import torch

        if not self.recording or not self.chunks:
            return None
        per_slot: list[list[Any]] = [[] for _ in self.slots]
        for rid, slots in self.chunks.items():
            rows = sum(c.shape[0] for c in slots[0]) if slots else 0
            if rows != self.prompt_lengths[rid]:
                raise CorruptCaptureError(
                    f"request {rid} fully prefilled ({self.prompt_lengths[rid]} tokens)",
                    f"{rows} captured rows", versions=guards.versions_text(), adapter=ID)
            for slot, chunks in enumerate(slots):
                per_slot[slot].extend(chunks)
        self.reset()
        joined = [torch.cat(chunks, dim=0) for chunks in per_slot]
        # Host memory, shared with the driver: pickling CUDA tensors through vLLM's
        # message queue costs more than the forward (docs/gpu-results.md).
        return shm.to_host([joined[self.slots[lid]] for lid in self.layer_ids])


def _setup_hidden_states_capture(self: Any, layer_ids: list[int]) -> None:
    previous = getattr(self, "_speccompat_capture", None)
    if previous is not None:
        previous.close()
    self._layer_ids = frozenset(layer_ids)
    self._speccompat_capture = LayerCapture(self, list(layer_ids))


def _reset_capture(self: Any) -> None:
    capture = getattr(self, "_speccompat_capture", None)
    if capture is None:
        raise RuntimeError("Must call _setup_hidden_states_capture before capturing states")
    capture.reset()


def _get_captured_states(self: Any) -> list[Any] | None:
    capture = getattr(self, "_speccompat_capture", None)
    return None if capture is None else capture.results()


def _probe() -> str | None:
    return require_in_source(
        WORKER_EXTENSION, "base_model.forward = types.MethodType(_patched_forward, base_model)",
        "def _get_captured_states(self)")


def _patch(patcher: Patcher) -> None:
    def on_extension(module: ModuleType) -> None:
        extension = module.HiddenStatesWorkerExtension
        patcher.replace(extension, "_setup_hidden_states_capture", _setup_hidden_states_capture)
        patcher.replace(extension, "_reset_capture", _reset_capture)
        patcher.replace(extension, "_get_captured_states", _get_captured_states)

    patcher.on_import(WORKER_EXTENSION, on_extension)


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0's worker captures through decoder-layer hooks while vLLM's own "
    "forward runs, per request, in admission order",
    upstream="vLLM 0.11.1 (get_input_embeddings -> embed_input_ids), 0.12.0 (llama_4_scaling "
    "passed to DeepseekV2DecoderLayer), 0.15.0/0.16.0 (KimiK25 language_model, no .model); "
    "DeepSeek not supports_eagle3 before 0.18.0",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
    why="the copied forward drifts with every vLLM release; hooks keep vLLM's forward",
)
