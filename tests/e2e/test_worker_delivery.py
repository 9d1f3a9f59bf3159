"""Worker-side adapters are active inside vLLM's spawned worker processes after the
parent's apply(), delivered by the vllm.general_plugins entry point; and only then."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat.adapters.model_forward_drift import ID as WORKER_ADAPTER
from support import requires_speculators, requires_vllm

pytestmark = [requires_vllm, requires_speculators]
EXTENSION = "speculators.data_generation.custom_worker.HiddenStatesWorkerExtension"


def _executor(model: Path, tp: int) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = EngineArgs(model=str(model), max_model_len=256, enforce_eager=True,
                        tensor_parallel_size=tp, worker_extension_cls=EXTENSION,
                        distributed_executor_backend="mp").create_engine_config()
    return MultiprocExecutor(vllm_config=config)


def _ask_workers(executor: Any) -> list[tuple[int, list[str], str | None, int]]:
    # Sent by value (cloudpickle); runs in each worker with its WorkerWrapperBase.
    def report(wrapper: Any) -> tuple[int, list[str], str | None, int]:
        import os

        from speccompat import active
        from speccompat.patching import patched_by

        worker = wrapper.worker
        setup = getattr(type(worker), "_setup_hidden_states_capture")  # noqa: B009
        return worker.rank, list(active()), patched_by(setup), os.getpid()

    return executor.collective_rpc(report)  # type: ignore[no-any-return]


@pytest.fixture
def clean() -> Iterator[None]:
    speccompat.revert()
    yield
    speccompat.revert()


@pytest.mark.usefixtures("clean")
def test_workers_apply_what_the_parent_applied(tiny_llama: Path) -> None:
    import os

    report = speccompat.apply()
    assert report.state_of(WORKER_ADAPTER) is speccompat.State.APPLIED
    executor = _executor(tiny_llama, tp=2)
    try:
        replies = _ask_workers(executor)
    finally:
        executor.shutdown()
    assert [rank for rank, *_ in replies] == [0, 1]
    worker_side = {o.adapter for o in report.outcomes
                   if o.state is speccompat.State.APPLIED and o.side is not speccompat.Side.DRIVER}
    for _, active, setup_patched_by, pid in replies:
        assert pid != os.getpid()  # a separate, spawned process
        assert set(active) == worker_side
        assert setup_patched_by == WORKER_ADAPTER


@pytest.mark.usefixtures("clean")
def test_workers_are_untouched_without_apply(tiny_llama: Path) -> None:
    executor = _executor(tiny_llama, tp=1)
    try:
        replies = _ask_workers(executor)
    finally:
        executor.shutdown()
    assert [(active, patched) for _, active, patched, _ in replies] == [([], None)]
