"""Invariants on captured data where it crosses from the workers to the generator.

Wrong structure raises :class:`CorruptCaptureError` before the generator can
slice it into samples; nothing here synchronises the GPU (shapes and dtypes
are metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import CorruptCaptureError
from ..versions import detect


def versions_text() -> str:
    env = detect()
    vllm = env.vllm.version if env.vllm else "none"
    spec = env.speculators.version if env.speculators else "none"
    return f"vLLM {vllm}, speculators {spec}"


def check_layer_states(
    states: Any,
    *,
    layers: int,
    rows: int,
    hidden: int,
    dtype: Any | None,
    adapter: str,
) -> None:
    """``states`` must be ``layers`` tensors of shape ``[rows, hidden]`` and one dtype."""
    expected = f"{layers} tensors of shape [{rows}, {hidden}]" + (f" in {dtype}" if dtype else "")

    def fail(found: str) -> None:
        raise CorruptCaptureError(expected, found, versions=versions_text(), adapter=adapter)

    if not isinstance(states, Sequence) or isinstance(states, (str, bytes)):
        fail(f"a {type(states).__name__}, not a list of tensors")
    if len(states) != layers:
        fail(f"{len(states)} items" + _shapes(states))
    one_dtype = dtype if dtype is not None else (states[0].dtype if len(states) else None)
    for index, tensor in enumerate(states):
        shape = tuple(getattr(tensor, "shape", ()))
        if len(shape) != 2 or shape != (rows, hidden):
            fail(f"item {index} of shape {list(shape)}" + _shapes(states))
        if tensor.dtype != one_dtype:
            fail(f"item {index} in {tensor.dtype}")


def _shapes(states: Sequence[Any]) -> str:
    shapes = [list(getattr(t, "shape", [])) for t in states[:4]]
    more = ", ..." if len(states) > 4 else ""
    return f" (shapes {shapes}{more})"


class CaptureExpectation:
    """What the generator asked the workers for, learned from the calls it makes.

    Fed by the executor view: layer ids from ``_setup_hidden_states_capture``,
    rows from each step's scheduled tokens and the prompts it admitted.
    """

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.layers: int | None = None
        self.scheduled_rows = 0
        self.prompt_rows = 0

    def observe_rpc(self, method: Any, args: tuple[Any, ...]) -> None:
        if method == "_setup_hidden_states_capture" and args:
            self.layers = len(list(args[0]))
        elif method == "_reset_capture":
            self.scheduled_rows = self.prompt_rows = 0

    def observe_step(self, scheduler_output: Any) -> None:
        self.scheduled_rows += int(scheduler_output.total_num_scheduled_tokens)
        for new in scheduler_output.scheduled_new_reqs:
            self.prompt_rows += len(new.prompt_token_ids or ())

    def check(self, states: Any, vllm_config: Any) -> None:
        rows, prompts = self.scheduled_rows, self.prompt_rows
        self.scheduled_rows = self.prompt_rows = 0
        if self.layers is None or (rows == 0 and states is None):
            return  # capture not set up through this view, or nothing was run
        if prompts != rows:
            raise CorruptCaptureError(
                f"every prompt fully prefilled ({prompts} prompt tokens)",
                f"{rows} tokens computed", versions=versions_text(), adapter=self.adapter)
        model = vllm_config.model_config
        check_layer_states(states, layers=self.layers, rows=rows, hidden=model.get_hidden_size(),
                           dtype=model.dtype, adapter=self.adapter)
