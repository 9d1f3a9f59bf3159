"""rpc.collective_rpc: one return contract over every executor class and vLLM release.

The fake executors copy vLLM's real ``collective_rpc`` signatures and return
conventions (reference/vllm-apis.md, section 1.1); only the transport to the
workers is replaced by in-process ``FakeWorker`` objects. As in vLLM, a
Multiproc executor broadcasts the call to every worker before it picks the
replies it waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from speccompat.inprocess import rpc
from speccompat.inprocess.rpc import collective_rpc, unique_reply_is_bare

HIDDEN = 3
LAYERS = 2


class FakeWorker:
    """A worker: ``method`` is looked up by name, or called with the worker, as vLLM does."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls: list[str] = []

    def run(self, method: str | Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any] | None) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", "callable")
        self.calls.append(name)
        if isinstance(method, str):
            return getattr(self, method)(*args, **(kwargs or {}))
        return method(self, *args, **(kwargs or {}))

    def get_rank(self) -> int:
        return self.rank

    def echo(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        return self.rank, args, kwargs

    def captured_states(self) -> list[list[float]]:
        """What the seed bug was about: a list of per-layer "tensors" (lists here)."""
        return [[float(self.rank * 100 + layer)] * HIDDEN for layer in range(LAYERS)]


@dataclass
class _Base:
    world_size: int
    workers: list[FakeWorker] = field(init=False)
    timeouts: list[float | None] = field(init=False, default_factory=list)
    unique_reply_ranks: list[int | None] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.workers = [FakeWorker(r) for r in range(self.world_size)]
        # Executor.__init__ keeps the config; MultiprocExecutor also sets world_size.
        self.parallel_config = SimpleNamespace(world_size=self.world_size)
        self.vllm_config = SimpleNamespace(parallel_config=self.parallel_config)

    def _broadcast(self, method: str | Callable[..., Any], timeout: float | None,
                   args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
        self.timeouts.append(timeout)
        return [w.run(method, args, kwargs) for w in self.workers]


class MultiprocExecutor_0_11_0(_Base):  # named after the release it copies
    """vllm/v1/executor/multiproc_executor.py, 0.10.0 - 0.11.0: always a list."""

    def collective_rpc(self,
                       method: str | Callable[..., Any],
                       timeout: float | None = None,
                       args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None,
                       non_block: bool = False,
                       unique_reply_rank: int | None = None) -> list[Any]:
        self.unique_reply_ranks.append(unique_reply_rank)
        replies = self._broadcast(method, timeout, args, kwargs)
        ranks = ((self.workers[unique_reply_rank].rank,) if unique_reply_rank is not None
                 else tuple(range(self.world_size)))
        return [replies[r] for r in ranks]


class MultiprocExecutor_0_11_1(_Base):
    """0.11.1 - 0.27.x: ``responses[0] if output_rank is not None else responses``."""

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        kv_output_aggregator: Any = None,
    ) -> Any:
        self.unique_reply_ranks.append(unique_reply_rank)
        output_rank = unique_reply_rank
        replies = self._broadcast(method, timeout, args, kwargs)
        response_mqs: tuple[int, ...] = tuple(range(self.world_size))
        if output_rank is not None:
            response_mqs = (response_mqs[output_rank],)
        responses = [replies[r] for r in response_mqs]
        return responses[0] if output_rank is not None else responses


class UniProcExecutor_0_10(_Base):
    """vllm/executor/uniproc_executor.py, 0.10.x: ``[answer]``, no unique_reply_rank."""

    def collective_rpc(self,
                       method: str | Callable[..., Any],
                       timeout: float | None = None,
                       args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        answer = self._broadcast(method, timeout, args, kwargs)[0]
        return [answer]


class UniProcExecutor_0_11_1(_Base):
    """vllm/v1/executor/uniproc_executor.py, 0.11.1+: ``single_value``, no unique_reply_rank."""

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        single_value: bool = False,
    ) -> Any:
        result = self._broadcast(method, timeout, args, kwargs)[0]
        return result if single_value else [result]


class RayDistributedExecutor_legacy(_Base):
    """V0 DistributedExecutorBase.collective_rpc (0.10.0 - 0.11.0): always a list."""

    def collective_rpc(self,
                       method: str | Callable[..., Any],
                       timeout: float | None = None,
                       args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        return self._broadcast(method, None, args, kwargs)  # timeout is ignored


class LLM(_Base):
    """vllm/entrypoints/llm.py: a list with one result per worker, on every release."""

    def collective_rpc(self,
                       method: str | Callable[..., Any],
                       timeout: float | None = None,
                       args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        return self._broadcast(method, timeout, args, kwargs)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], _Base]
    vllm: str
    takes_unique_reply_rank: bool


CASES = [
    Case("multiproc-0.11.0", lambda: MultiprocExecutor_0_11_0(4), "0.11.0", True),
    Case("multiproc-0.10.1.1", lambda: MultiprocExecutor_0_11_0(2), "0.10.1.1", True),
    Case("multiproc-0.11.1", lambda: MultiprocExecutor_0_11_1(4), "0.11.1", True),
    Case("multiproc-0.11.1-dev", lambda: MultiprocExecutor_0_11_1(2), "0.11.1.dev5+gabc", True),
    Case("multiproc-0.16.0", lambda: MultiprocExecutor_0_11_1(8), "0.16.0", True),
    Case("uniproc-0.10", lambda: UniProcExecutor_0_10(1), "0.10.2", False),
    Case("uniproc-0.16.0", lambda: UniProcExecutor_0_11_1(1), "0.16.0", False),
    Case("ray-legacy-0.11.0", lambda: RayDistributedExecutor_legacy(2), "0.11.0", False),
    Case("llm-0.11.0", lambda: LLM(2), "0.11.0", False),
    Case("llm-0.16.0", lambda: LLM(3), "0.16.0", False),
]


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Case:
    chosen: Case = request.param
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", chosen.vllm)
    unique_reply_is_bare.cache_clear()
    return chosen


def test_rank_none_gives_a_list_per_worker(case: Case) -> None:
    executor = case.make()
    result = collective_rpc(executor, "get_rank")
    assert type(result) is list
    assert result == list(range(executor.world_size))


def test_rank_gives_the_bare_result(case: Case) -> None:
    executor = case.make()
    for rank in range(executor.world_size):
        assert collective_rpc(executor, "get_rank", rank=rank) == rank


def test_rank_gives_a_list_result_unwrapped(case: Case) -> None:
    # The seed bug: a list of per-layer tensors must come back as that list, not its [0].
    executor = case.make()
    for rank in range(executor.world_size):
        states = collective_rpc(executor, "captured_states", rank=rank)
        assert states == executor.workers[rank].captured_states()
        assert len(states) == LAYERS
        assert all(len(layer) == HIDDEN for layer in states)


def test_rank_none_with_list_results(case: Case) -> None:
    executor = case.make()
    states = collective_rpc(executor, "captured_states")
    assert len(states) == executor.world_size
    assert states == [w.captured_states() for w in executor.workers]


def test_args_kwargs_and_callables_reach_the_workers(case: Case) -> None:
    executor = case.make()
    assert collective_rpc(executor, "echo", rank=0, args=(1, 2), kwargs={"k": 3}) == (
        0, (1, 2), {"k": 3})
    assert collective_rpc(executor, "echo") == [
        (r, (), {}) for r in range(executor.world_size)]

    def times_ten(worker: FakeWorker, factor: int = 10) -> int:
        return worker.rank * factor

    last = executor.world_size - 1
    assert collective_rpc(executor, times_ten, rank=last) == last * 10
    assert collective_rpc(executor, times_ten, kwargs={"factor": 2}) == [
        r * 2 for r in range(executor.world_size)]


def test_timeout_is_passed_on(case: Case) -> None:
    executor = case.make()
    collective_rpc(executor, "get_rank", timeout=5.0)
    collective_rpc(executor, "get_rank", rank=0, timeout=7.0)
    if not isinstance(executor, RayDistributedExecutor_legacy):
        assert executor.timeouts == [5.0, 7.0]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.name)
     for c in CASES],
    indirect=True,
)
def test_rank_out_of_range_is_a_value_error(case: Case) -> None:
    executor = case.make()
    with pytest.raises(ValueError, match=f"rank {executor.world_size}"):
        collective_rpc(executor, "get_rank", rank=executor.world_size)


def test_negative_rank_is_a_value_error_and_runs_nothing(case: Case) -> None:
    executor = case.make()
    with pytest.raises(ValueError, match="rank must be >= 0, got -1"):
        collective_rpc(executor, "get_rank", rank=-1)
    assert all(w.calls == [] for w in executor.workers)


def test_unique_reply_rank_is_used_where_the_executor_has_it(case: Case) -> None:
    executor = case.make()
    last = executor.world_size - 1
    assert collective_rpc(executor, "get_rank", rank=last) == last
    collective_rpc(executor, "get_rank")
    # Only executors that take unique_reply_rank are given it (the others would raise TypeError).
    expected = [last, None] if case.takes_unique_reply_rank else []
    assert executor.unique_reply_ranks == expected


# --------------------------------------------------------------------------- the version switch


@pytest.mark.parametrize(
    ("version", "bare"),
    [("0.10.1.1", False), ("0.11.0", False), ("0.11.1rc1", True), ("0.11.1.dev123+gabc", True),
     ("0.11.1", True), ("0.16.0+cpu", True)],
)
def test_unique_reply_is_bare(version: str, bare: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", version)
    unique_reply_is_bare.cache_clear()
    assert unique_reply_is_bare() is bare


@pytest.mark.usefixtures("no_vllm_installed")
def test_unique_reply_is_bare_without_vllm() -> None:
    unique_reply_is_bare.cache_clear()
    with pytest.raises(ImportError, match="vLLM is not installed"):
        unique_reply_is_bare()


def test_unique_reply_is_bare_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.11.0")
    rpc.unique_reply_is_bare.cache_clear()
    assert rpc.unique_reply_is_bare() is False
    monkeypatch.setenv("SPECCOMPAT_VLLM_VERSION", "0.16.0")
    assert rpc.unique_reply_is_bare() is False  # read once per process
    rpc.unique_reply_is_bare.cache_clear()
    assert rpc.unique_reply_is_bare() is True


@pytest.mark.usefixtures("no_vllm_installed")
def test_rank_none_does_not_need_the_vllm_version() -> None:
    # No vLLM and no override: the list path never asks for the version.
    assert collective_rpc(MultiprocExecutor_0_11_1(2), "get_rank") == [0, 1]
    assert collective_rpc(LLM(2), "get_rank", rank=1) == 1
