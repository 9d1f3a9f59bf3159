"""Hidden-state capture through forward hooks on vLLM's decoder layers, per request.

speculators 0.3.0 and 0.4.0 capture by replacing the base model's ``forward`` with a
copy of an old vLLM one, which drifts with every release (see
``inprocess/adapters/model_forward_drift.py``). Hooks on the requested decoder layers see what
vLLM's own forward passes them, so nothing is copied.

Rows are assigned to requests in the order the model runner laid the batch out:
the V1 runner keeps ``input_batch.req_ids``; Model Runner V2 (vLLM 0.12.0 opt-in,
default per architecture from 0.22.0, for every model from 0.29.0 on CUDA) has no
``input_batch`` and sorts each step's requests itself, so the capture reads the
``InputBatch`` its ``prepare_inputs`` returned for the step.
"""

from __future__ import annotations

import math
import os
from itertools import pairwise
from typing import Any

from ..errors import CorruptCaptureError
from ..patching import Patcher
from . import guards, shm

Layout = list[tuple[str, int, int]]  # (request id, first row, row count) per request
_Rows = tuple[int, int, Any]  # (layer slot, first row in the batch, the captured rows)
# "0": copy speculators 0.3.0's reply to host memory after a batch's last step, not step
# by step (bench/gpu_extract.py's (b'')).
STREAM_ENV = "SPECCOMPAT_CAPTURE_STREAM"


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

    def __init__(self, worker: Any, layer_ids: list[int], adapter: str, *,
                 stream_to_host: bool = False) -> None:
        """``stream_to_host``: also write each step's captured rows into a shared-memory
        slot while the next step computes (``streamed_layers``: speculators 0.3.0's reply,
        one tensor per layer id with every request's rows in admission order)."""
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
        self._start(layer_ids, get_tp_group().rank_in_group == 0, stream_to_host)
        self.handles = [
            stack.layers[lid].register_forward_hook(self._hook(slot))
            for lid, slot in self.slots.items()
        ]
        self.patcher = Patcher(adapter)
        self._wrap_runner()

    def _start(self, layer_ids: list[int], recording: bool, stream_to_host: bool) -> None:
        """The state that needs no vLLM (tests build a capture from here)."""
        self.layer_ids = [int(i) for i in layer_ids]
        self.slots = {lid: n for n, lid in enumerate(sorted(set(self.layer_ids)))}
        self.recording = recording
        # One view per id: a repeated id would make two list entries share memory.
        self.stream_to_host = (stream_to_host and len(self.slots) == len(self.layer_ids)
                               and os.environ.get(STREAM_ENV, "1") != "0")
        self.streamed: _StreamedLayers | None = None
        self.streamed_capacity = 0  # rows of the largest batch so far, with headroom
        self.step: Any = None
        self.layout: Layout | None = None
        self.prepared: Any = None
        self.reset()

    @property
    def runner_v2(self) -> bool:
        return not hasattr(self.runner, "input_batch") and hasattr(self.runner, "prepare_inputs")

    def reset(self) -> None:
        self._drop_streamed()
        self.chunks: dict[str, list[list[Any]]] = {}
        self.prompt_lengths: dict[str, int] = {}
        self.admitted_rows = 0
        self.first_row: dict[str, int] = {}  # each request's first row in the batch
        self.streaming = self.stream_to_host
        self.outgrown = False  # admitted past the slot: written whole at the reply
        self.pending: list[_Rows] = []  # captured in the current step, not yet written

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.patcher.revert()
        self._drop_streamed()

    def _drop_streamed(self) -> None:
        streamed = getattr(self, "streamed", None)
        if streamed is not None:
            streamed.release()
        self.streamed = None

    def _wrap_runner(self) -> None:
        # Only this runner instance (``close`` removes its attributes again, and the class's
        # methods show through): warm-up and profiling runs (no step) capture nothing.
        runner_execute = type(self.runner).execute_model.__get__(self.runner)

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dummy_run"):
                # Model Runner V2 warms up and profiles through execute_model.
                return runner_execute(scheduler_output, *args, **kwargs)
            previous = self.begin_step(scheduler_output)
            try:
                return runner_execute(scheduler_output, *args, **kwargs)
            finally:
                self.end_step(previous)

        self.patcher.replace(self.runner, "execute_model", execute_model)
        if self.runner_v2:
            runner_prepare = type(self.runner).prepare_inputs.__get__(self.runner)

            def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
                batch = runner_prepare(*args, **kwargs)
                if self.step is not None:
                    self.prepared = batch
                return batch

            self.patcher.replace(self.runner, "prepare_inputs", prepare_inputs)

    def begin_step(self, scheduler_output: Any) -> tuple[list[_Rows], Any]:
        """Before the runner's forward of a step: what ``end_step`` writes to the host."""
        self._admit(scheduler_output)
        previous, self.pending = self.pending, []
        computed = _mark_computed(previous)
        self.step, self.layout, self.prepared = scheduler_output, None, None
        return previous, computed

    def end_step(self, previous: tuple[list[_Rows], Any]) -> None:
        """After the runner queued the step's forward: the step before's rows travel to the
        host while this one computes (queued behind its forward, so launching the copies
        costs the GPU nothing); this step's rows wait for the next step or the reply."""
        self.step = self.layout = self.prepared = None
        self._write(*previous)

    def _admit(self, scheduler_output: Any) -> None:
        # Scheduled in FCFS order, which is the order the generator added them in.
        for new in scheduler_output.scheduled_new_reqs:
            self.prompt_lengths[new.req_id] = len(new.prompt_token_ids or ())
            self.chunks[new.req_id] = [[] for _ in self.slots]
            self.first_row[new.req_id] = self.admitted_rows
            self.admitted_rows += self.prompt_lengths[new.req_id]
        if self.streamed is not None and self.admitted_rows > self.streamed.capacity:
            # Admitted after the slot was sized: the batch is written whole at the reply,
            # into a slot sized like every later one (a slot of another size would be
            # page-locked afresh when a later batch outgrows it: 1 s on an H200).
            self.outgrown = True
            self._drop_streamed()
        self.streamed_capacity = max(self.streamed_capacity,
                                     int(self.admitted_rows * shm.GROWTH))

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
                chunk = value[first:first + count]
                if self.streaming:
                    before = sum(c.shape[0] for c in self.chunks[rid][slot])
                    self.pending.append((slot, self.first_row[rid] + before, chunk))
                self.chunks[rid][slot].append(chunk)

        return hook

    def _write(self, rows: list[_Rows], computed: Any) -> None:
        """Start writing ``rows`` into the batch's slot (reserved by the first write) once
        ``computed`` (a CUDA event; None: all work queued so far) has passed."""
        if not rows or not self.streaming or self.outgrown:
            return
        if self.streamed is None:
            self.streamed = _StreamedLayers.reserve(
                max(self.admitted_rows, self.streamed_capacity), rows[0][2], len(self.slots))
        if self.streamed is None or not all(self.streamed.fits(c) for _, _, c in rows):
            self.streaming = False  # this batch takes the copying way (per_request)
            self._drop_streamed()
            return
        self.streamed.write(rows, computed)

    def _check_complete(self) -> None:
        for rid, slots in self.chunks.items():
            rows = sum(c.shape[0] for c in slots[0]) if slots else 0
            if rows != self.prompt_lengths[rid]:
                raise CorruptCaptureError(
                    f"request {rid} fully prefilled ({self.prompt_lengths[rid]} tokens)",
                    f"{rows} captured rows", versions=guards.versions_text(),
                    adapter=self.adapter)

    def streamed_layers(self) -> list[Any] | None:
        """One tensor per layer id, every request's rows in admission order, in the slot the
        hooks wrote them to; None where nothing was streamed (use ``per_request``). Raises
        unless every request was captured over its whole prompt."""
        if not self.recording or not self.chunks or not self.streaming:
            return None
        self._check_complete()
        last, self.pending = self.pending, []
        if self.outgrown:
            self.outgrown = False
            last = [(slot, self.first_row[rid] + sum(c.shape[0] for c in chunks[:n]), chunk)
                    for rid, slots in self.chunks.items()
                    for slot, chunks in enumerate(slots) for n, chunk in enumerate(chunks)]
        self._write(last, None)
        if self.streamed is None:
            return None
        streamed, self.streamed = self.streamed, None
        layers = streamed.hand_over(self.admitted_rows,
                                    [self.slots[lid] for lid in self.layer_ids])
        self.reset()
        return layers

    def per_request(self) -> dict[str, list[Any]] | None:
        """Each request's states, one tensor per requested layer id, in admission order;
        raises unless every request was captured over its whole prompt."""
        import torch

        if not self.recording or not self.chunks:
            return None
        self._check_complete()
        out: dict[str, list[Any]] = {}
        for rid, slots in self.chunks.items():
            joined = [torch.cat(chunks, dim=0) for chunks in slots]
            out[rid] = [joined[self.slots[lid]] for lid in self.layer_ids]
        self.reset()
        return out


def _mark_computed(rows: list[_Rows]) -> Any:
    """A CUDA event after the work queued so far, which produced ``rows`` (None: not CUDA)."""
    if not rows or rows[0][2].device.type != "cuda":
        return None
    import torch

    return torch.cuda.current_stream(rows[0][2].device).record_event()


class _StreamedLayers:
    """A batch's captured layers written into a reserved shared-memory slot step by step:
    region ``slot`` holds that layer's rows, a request's at its admission offset. On CUDA
    a step's copies run on a side stream while the next step computes (the copy of the
    whole batch after its last step was 0.46 s of 16 s on an H200, docs/results/gpu-results.md);
    only the last step's copy is left to wait for. Copying during the forward itself, layer
    by layer, made the forward slower than the copy it hid (docs/results/gpu-results.md)."""

    def __init__(self, reservation: shm.Reservation, capacity: int, chunk: Any,
                 row_bytes: int, region: int) -> None:
        self.reservation = reservation
        self.capacity, self.row_bytes, self.region = capacity, row_bytes, region
        self.row_shape, self.dtype = tuple(chunk.shape[1:]), chunk.dtype
        self.stream: Any = None

    @classmethod
    def reserve(cls, capacity: int, chunk: Any, slots: int) -> _StreamedLayers | None:
        row_bytes = math.prod(chunk.shape[1:]) * chunk.element_size()
        region = -(-capacity * row_bytes // shm.ALIGN) * shm.ALIGN
        reservation = shm.reserve(shm.HEADER + slots * region, for_cuda=chunk.is_cuda)
        if reservation is None:
            return None
        return cls(reservation, capacity, chunk, row_bytes, region)

    def fits(self, chunk: Any) -> bool:
        return tuple(chunk.shape[1:]) == self.row_shape and chunk.dtype == self.dtype

    def write(self, rows: list[_Rows], computed: Any) -> None:
        import torch

        targets = []
        for slot, row, chunk in rows:
            start = shm.HEADER + slot * self.region + row * self.row_bytes
            target = self.reservation.storage[start:start + chunk.shape[0] * self.row_bytes]
            targets.append(target.view(self.dtype).view(chunk.shape))
        device = rows[0][2].device
        if device.type != "cuda":
            for target, (_, _, chunk) in zip(targets, rows, strict=True):
                target.copy_(chunk)
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=device)
        if computed is None:
            self.stream.wait_stream(torch.cuda.current_stream(device))
        else:
            self.stream.wait_event(computed)
        # The chunks stay referenced (LayerCapture.chunks) until wait() returns, so their
        # memory is not reused while the copies read it.
        with torch.cuda.stream(self.stream):
            for target, (_, _, chunk) in zip(targets, rows, strict=True):
                target.copy_(chunk, non_blocking=True)

    def wait(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def hand_over(self, rows: int, regions: list[int]) -> list[Any]:
        self.wait()
        dtype = str(self.dtype).removeprefix("torch.")
        layout = [(dtype, (rows, *self.row_shape), shm.HEADER + r * self.region) for r in regions]
        return self.reservation.hand_over(layout)

    def release(self) -> None:
        self.wait()  # no copy may land in a slot that is given out again
        self.reservation.release()
