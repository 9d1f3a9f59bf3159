"""``collective_rpc(..., unique_reply_rank=r)`` returns the bare result from vLLM 0.11.1.

speculators 0.3.0 indexes the reply with ``[0]``, which on 0.11.1+ picks the
first layer's tensor and writes garbage without an error. vLLM's own callers
rely on the bare return, so vLLM is left alone: the generator gets a view of
its executor that keeps the <= 0.11.0 list contract it was written for, and
the captured states are checked before the generator slices them.

speculators 0.4.0 was written for the bare return; on vLLM 0.11.0 it looks the
request ids up in the one-element list and fails (AttributeError, as it reports
the first one missing), so its view of the executor gives the bare result there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import WorkerFailedError
from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, SourceDef, source_def
from ...versions import spec
from ...wrappers import Proxy, wrap_factory
from .. import guards, teardown
from ..rpc import collective_rpc

ID = "vllm.collective_rpc_unique_reply_rank"
ID_V04 = "vllm.collective_rpc_unique_reply_rank.speculators_0_4"


class BareReplyExecutor(Proxy):
    """The executor as speculators 0.4.0 expects it: a unique reply comes as ``result``."""

    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        **extra: Any,
    ) -> Any:
        # Only the plain blocking one-rank call changed; anything else passes through as is.
        if unique_reply_rank is None or non_block or extra:
            return self._call(method, args, lambda: self.inner.collective_rpc(
                method, timeout=timeout, args=args, kwargs=kwargs, non_block=non_block,
                unique_reply_rank=unique_reply_rank, **extra))
        return self._unique_reply(method, self._call(method, args, lambda: collective_rpc(
            self.inner, method, rank=unique_reply_rank, args=args, kwargs=kwargs,
            timeout=timeout)))

    def _call(self, method: Any, args: tuple[Any, ...], call: Callable[[], Any]) -> Any:
        return call()

    def _unique_reply(self, method: Any, result: Any) -> Any:
        return result


class ListReplyExecutor(BareReplyExecutor):
    """The executor as speculators 0.3.0 expects it: a unique reply comes as ``[result]``.

    A worker failure becomes one ``WorkerFailedError``; the batch it interrupted is
    lost, and so is the executor: it is shut down at once (``teardown``: left to garbage
    collection, vLLM 0.22's hangs the caller), and every later call raises too, rather
    than return states mixed with the interrupted batch's.
    """

    # Set with object.__setattr__ (Proxy forwards plain assignment to the executor);
    # read as usual, since instance attributes are found before Proxy.__getattr__.
    _capture: guards.CaptureExpectation
    _failure: str | None

    def __init__(self, executor: Any) -> None:
        super().__init__(executor)
        object.__setattr__(self, "_capture", guards.CaptureExpectation(ID))
        object.__setattr__(self, "_failure", None)

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        if self._failure is not None:
            raise WorkerFailedError(
                f"{what}: this generator's vLLM workers failed earlier ({self._failure}); "
                "build a new generator")
        try:
            return call()
        except RuntimeError as exc:
            object.__setattr__(self, "_failure", str(exc))
            teardown.shut_down(self.unwrapped)
            raise WorkerFailedError(
                f"a vLLM worker failed during {what}: {exc}. No result of the batch was "
                "returned, and this generator cannot be used again: build a new one") from exc

    def _call(self, method: Any, args: tuple[Any, ...], call: Callable[[], Any]) -> Any:
        self._capture.observe_rpc(method, args)
        return self._guarded(str(method), call)

    def _unique_reply(self, method: Any, result: Any) -> Any:
        if method == "_get_captured_states":
            self._capture.check(result, self.unwrapped.vllm_config)
        return [result]

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._capture.observe_step(scheduler_output)
        return self._guarded("execute_model", lambda: self.inner.execute_model(
            scheduler_output, *args, **kwargs))


def _collective_rpc() -> SourceDef | None:
    # Read, not imported: importing the executor module costs seconds in apply().
    return source_def("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.collective_rpc")


def _probe() -> str | None:
    rpc = _collective_rpc()
    if rpc is None or "unique_reply_rank" not in rpc.params:
        return "MultiprocExecutor.collective_rpc has no unique_reply_rank parameter"
    if "responses[0] if output_rank is not None" not in rpc.text:
        return "MultiprocExecutor.collective_rpc no longer returns responses[0] for one rank"
    return None


def _probe_v04() -> str | None:
    rpc = _collective_rpc()
    if rpc is None or "unique_reply_rank" not in rpc.params:
        return "MultiprocExecutor.collective_rpc has no unique_reply_rank parameter"
    if "responses[0] if output_rank is not None" in rpc.text or "return responses" not in rpc.text:
        return "MultiprocExecutor.collective_rpc no longer returns the list of responses"
    return None


def _patch_v04(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, BareReplyExecutor))


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "MultiprocExecutor",
                           lambda original: wrap_factory(original, ListReplyExecutor))


ADAPTER = Adapter(
    id=ID,
    summary="speculators 0.3.0 sees a unique reply as [result] again, and the states are checked",
    why="speculators 0.3.0's [0] on the bare reply picks the first layer's tensor and writes "
    "total_tokens tensors of shape [seq_len] instead of one [seq_len, hidden] per layer, with no "
    "error",
    how="wraps the generator's MultiprocExecutor in a view whose "
    "collective_rpc(unique_reply_rank=r) returns [result], and checks the captured states (guards)",
    upstream="vLLM 0.11.1: MultiprocExecutor.collective_rpc returns responses[0] when "
    "unique_reply_rank is set (executor rework, PR #28012)",
    upstream_ref="vLLM PR #28012 (executor rework, in 0.11.1)",
    vllm=spec(">=0.11.1"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 dropped the [0])",
)

ADAPTER_V04 = Adapter(
    id=ID_V04,
    summary="speculators 0.4.0 sees a unique reply as the bare result on vLLM 0.11.0 too",
    why="speculators 0.4.0 looks the request ids up in the reply; on vLLM 0.11.0 the reply is a "
    "one-element list and the lookup fails (AttributeError)",
    how="wraps the generator's MultiprocExecutor in a view whose "
    "collective_rpc(unique_reply_rank=r) returns the bare result",
    upstream="vLLM 0.11.1: MultiprocExecutor.collective_rpc returns responses[0] when "
    "unique_reply_rank is set; speculators 0.4.0 expects that",
    upstream_ref="vLLM PR #28012 (executor rework, in 0.11.1), whose return speculators 0.4.0 "
    "expects",
    vllm=spec("<0.11.1"),
    speculators=spec("==0.4.*"),
    side=Side.DRIVER,
    probe=_probe_v04,
    patch=_patch_v04,
    remove_when="vLLM 0.11.0 is no longer supported with speculators 0.4.0",
)
