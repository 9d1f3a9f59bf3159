"""Hidden-state capture through forward hooks on vLLM's decoder layers, per request.

speculators 0.3.0 and 0.4.0 capture by replacing the base model's ``forward`` with a
copy of an old vLLM one, which drifts with every release (see
``adapters/model_forward_drift.py``). Hooks on the requested decoder layers see what
vLLM's own forward passes them, so nothing is copied.

Rows are assigned to requests in the order the model runner laid the batch out:
the V1 runner keeps ``input_batch.req_ids``; Model Runner V2 (vLLM 0.12.0 opt-in,
default per architecture from 0.22.0, for every model from 0.29.0 on CUDA) has no
``input_batch`` and sorts each step's requests itself, so the capture reads the
``InputBatch`` its ``prepare_inputs`` returned for the step.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from . import guards
from .errors import CorruptCaptureError
from .patching import Patcher

Layout = list[tuple[str, int, int]]  # (request id, first row, row count) per request


def decoder_stack(model: Any) -> Any:
    """The module that holds the decoder ``layers`` of a vLLM model.

    Causal LMs keep it at ``model.model``; multimodal wrappers such as
    Kimi-K2.5 expose ``get_language_model()``, which is the stack itself
    (vLLM 0.15.x) or a causal LM whose ``.model`` is (0.16.0+).
    """
    candidates: list[Any] = []
    if hasattr(model, "get_language_model"):
        language_model = model.get_language_model()
        candidates += [language_model, getattr(language_model, "model", None)]
    candidates += [getattr(model, "model", None), model]
    for candidate in candidates:
        if candidate is not None and hasattr(candidate, "layers"):
            return candidate
    raise LookupError(
        f"cannot find the decoder layers of {type(model).__name__}: no .layers on "
        "get_language_model(), .model or the model itself"
    )


class LayerCapture:
    """Forward hooks on decoder layers of one worker, and what they captured per request."""

    def __init__(self, worker: Any, layer_ids: list[int], adapter: str) -> None:
        from vllm.distributed import get_pp_group, get_tp_group

        if get_pp_group().world_size > 1:
            raise NotImplementedError(
                "hidden-state capture with pipeline parallelism: the generator asks rank 0 only, "
                "which does not hold every layer; use tensor parallelism")
        self.adapter = adapter
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
        self.layout: Layout | None = None
        self.prepared: Any = None
        self.reset()
        self.patcher = Patcher(adapter)
        self._wrap_runner()

    @property
    def runner_v2(self) -> bool:
        return not hasattr(self.runner, "input_batch") and hasattr(self.runner, "prepare_inputs")

    def reset(self) -> None:
        self.chunks: dict[str, list[list[Any]]] = {}
        self.prompt_lengths: dict[str, int] = {}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.patcher.revert()

    def _wrap_runner(self) -> None:
        # Only this runner instance (``close`` removes its attributes again, and the class's
        # methods show through): warm-up and profiling runs (no step) capture nothing.
        runner_execute = type(self.runner).execute_model.__get__(self.runner)

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dummy_run"):
                # Model Runner V2 warms up and profiles through execute_model.
                return runner_execute(scheduler_output, *args, **kwargs)
            self._admit(scheduler_output)
            self.step, self.layout, self.prepared = scheduler_output, None, None
            try:
                return runner_execute(scheduler_output, *args, **kwargs)
            finally:
                self.step = self.layout = self.prepared = None

        self.patcher.replace(self.runner, "execute_model", execute_model)
        if self.runner_v2:
            runner_prepare = type(self.runner).prepare_inputs.__get__(self.runner)

            def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
                batch = runner_prepare(*args, **kwargs)
                if self.step is not None:
                    self.prepared = batch
                return batch

            self.patcher.replace(self.runner, "prepare_inputs", prepare_inputs)

    def _admit(self, scheduler_output: Any) -> None:
        # Scheduled in FCFS order, which is the order the generator added them in.
        for new in scheduler_output.scheduled_new_reqs:
            self.prompt_lengths[new.req_id] = len(new.prompt_token_ids or ())
            self.chunks[new.req_id] = [[] for _ in self.slots]

    def _batch_layout(self) -> Layout:
        if self.runner_v2:
            batch = self.prepared
            if batch is None:
                raise CorruptCaptureError(
                    "the step's InputBatch from Model Runner V2's prepare_inputs",
                    "a forward without one", versions=guards.versions_text(),
                    adapter=self.adapter)
            req_ids = list(batch.req_ids)
            counts = [int(n) for n in batch.num_scheduled_tokens[: len(req_ids)]]
            # The rows attention reads: num_scheduled_tokens is only an upper bound
            # where draft tokens are scheduled (adaptive verification, vLLM >= 0.28.0).
            starts = [int(n) for n in batch.query_start_loc_np[: len(req_ids) + 1]]
            rows = [end - start for start, end in pairwise(starts)]
            if starts[:1] != [0] or rows != counts:
                raise CorruptCaptureError(
                    f"rows {counts} per request as scheduled", f"query_start_loc {starts}",
                    versions=guards.versions_text(), adapter=self.adapter)
        else:
            # The V1 runner lays tokens out in input_batch order (gpu_model_runner.py).
            wanted = self.step.num_scheduled_tokens
            req_ids = [rid for rid in self.runner.input_batch.req_ids if rid is not None]
            counts = [int(wanted[rid]) for rid in req_ids]
        layout, first = [], 0
        for rid, count in zip(req_ids, counts, strict=True):
            layout.append((rid, first, count))
            first += count
        return layout

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
            rows = sum(n for _, _, n in self.layout)
            if value.shape[0] < rows:
                raise CorruptCaptureError(
                    f"{rows} rows from decoder layer", f"{value.shape[0]} rows "
                    "(token-sharded layer output, e.g. sequence-parallel MoE)",
                    versions=guards.versions_text(), adapter=self.adapter)
            for rid, first, count in self.layout:
                if rid not in self.chunks:
                    raise CorruptCaptureError(
                        "rows of requests admitted since the last reset",
                        f"rows of request {rid}, scheduled without being admitted",
                        versions=guards.versions_text(), adapter=self.adapter)
                self.chunks[rid][slot].append(value[first:first + count])

        return hook

    def per_request(self) -> dict[str, list[Any]] | None:
        """Each request's states, one tensor per requested layer id, in admission order;
        raises unless every request was captured over its whole prompt."""
        import torch

        if not self.recording or not self.chunks:
            return None
        out: dict[str, list[Any]] = {}
        for rid, slots in self.chunks.items():
            rows = sum(c.shape[0] for c in slots[0]) if slots else 0
            if rows != self.prompt_lengths[rid]:
                raise CorruptCaptureError(
                    f"request {rid} fully prefilled ({self.prompt_lengths[rid]} tokens)",
                    f"{rows} captured rows", versions=guards.versions_text(),
                    adapter=self.adapter)
            joined = [torch.cat(chunks, dim=0) for chunks in slots]
            out[rid] = [joined[self.slots[lid]] for lid in self.layer_ids]
        self.reset()
        return out
