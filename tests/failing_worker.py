"""A worker extension that fails mid-extraction, for the failure tests (imported by workers)."""

from __future__ import annotations

from typing import Any

from speculators.data_generation.custom_worker import HiddenStatesWorkerExtension

FAIL_AT_STEP = 2


class FailingExtension(HiddenStatesWorkerExtension):  # type: ignore[misc]
    """speculators' extension whose layer 1 raises in the second forward of a batch
    (armed by ``_reset_capture``, which the generator calls before each batch, so the
    warm-up runs in the constructor pass)."""

    def _setup_hidden_states_capture(self, layer_ids: list[int]) -> None:
        super()._setup_hidden_states_capture(layer_ids)
        self._forwards: int | None = None

        def fail(module: Any, args: Any) -> None:
            if self._forwards is None:
                return
            self._forwards += 1
            if self._forwards == FAIL_AT_STEP:
                raise RuntimeError("injected failure in decoder layer 1")

        self.model_runner.get_model().model.layers[1].register_forward_pre_hook(fail)

    def _reset_capture(self) -> None:
        super()._reset_capture()
        self._forwards = 0

