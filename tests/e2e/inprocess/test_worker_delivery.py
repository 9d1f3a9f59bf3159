"""Worker-side adapters are active inside vLLM's spawned worker processes after the
parent's apply(), delivered by the vllm.general_plugins entry point; and only then."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat.inprocess.adapters import (
    attn_mask_utils_removed,
    config_dtype_annotation,
    get_hash_fn_by_name_moved,
    model_forward_drift,
)
from support import adapter_applies, requires_generator, requires_speculators, requires_vllm

pytestmark = [requires_vllm, requires_speculators, requires_generator]
EXTENSION = "speculators.data_generation.custom_worker.HiddenStatesWorkerExtension"
# Without these (where they apply) speculators' worker extension does not import at all.
IMPORT_FIXES = (get_hash_fn_by_name_moved.ID, config_dtype_annotation.ID,
                attn_mask_utils_removed.ID)


def _worker_adapter() -> str:
    """The worker-side adapter that patches the extension here (one per speculators release)."""
    for adapter_id in (model_forward_drift.ID, model_forward_drift.ID_V04):
        if adapter_applies(adapter_id)[0]:
            return adapter_id
    _, why = adapter_applies(model_forward_drift.ID)
    pytest.skip(f"no worker-side adapter patches speculators' extension here ({why})")


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

    worker_adapter = _worker_adapter()
    report = speccompat.apply()
    assert report.state_of(worker_adapter) is speccompat.State.APPLIED
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
        assert setup_patched_by == worker_adapter


@pytest.mark.usefixtures("clean")
def test_workers_are_untouched_without_apply(tiny_llama: Path) -> None:
    needed = [i for i in IMPORT_FIXES if adapter_applies(i)[0]]
    if needed:
        pytest.skip(f"speculators' worker extension does not import here without {needed} "
                    "(their contract tests check the workers' import)")
    executor = _executor(tiny_llama, tp=1)
    try:
        replies = _ask_workers(executor)
    finally:
        executor.shutdown()
    assert [(active, patched) for _, active, patched, _ in replies] == [([], None)]
