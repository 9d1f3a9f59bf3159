"""From vLLM 0.24.0 ``ExampleHiddenStatesConnector`` answers a request before its file is
written: ``request_finished`` returns ``{"hidden_states_path": ...}`` at once, the states are
copied out of the cache at the worker's next ``get_finished`` and written by a thread pool,
and a client is meant to wait on ``<path>.lock`` (held ``LOCK_EX`` by the worker until the
write ends). speculators 0.5.0's client was written for the writer before, which had the
file on disk when the reply came: it moves the returned path at once and fails with
``FileNotFoundError`` (seen in the matrix cell vLLM 0.26.0 x speculators 0.5.0; 0.6.0 added
``wait_for_lock``).

The API server's ``AsyncLLM.generate`` now holds a finished output that names a
``hidden_states_path`` until that file's lock is free, so the reply means "written" again,
as speculators 0.5.0 expects. The wait polls a shared ``flock`` on the event loop (no
thread per request); a writer that dies releases its lock, so the wait ends with it.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import HIDDEN_STATES_CONNECTOR, require_in_source
from ...versions import spec

ID = "vllm.hidden_states_connector_reply_before_write"
CONNECTOR = HIDDEN_STATES_CONNECTOR
ASYNC_LLM = "vllm.v1.engine.async_llm"
# The reply carries the path from request_finished; the worker pre-creates the lock and a
# thread pool writes the file later.
REPLY = 'return True, {"hidden_states_path": filename}'
LOCK_TAKEN = "fcntl.flock(lock_fd, fcntl.LOCK_EX)"
THREAD_WRITE = "self._executor.submit("
GENERATE = "async def generate("
PATH_KEY = "hidden_states_path"
# Poll interval bounds: the write of one prompt's states takes milliseconds to seconds.
FIRST_POLL_S = 0.001
LONGEST_POLL_S = 0.05


def lock_is_held(path: str) -> bool:
    """Whether ``<path>.lock`` exists and its writer still holds it (a shared lock cannot
    be taken now)."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except FileNotFoundError:
        # No lock: the write ended and a client removed it, or the connector runs without
        # locks (use_synchronization_lock=false), where there is nothing to wait on.
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared lock, if taken
    return False


async def until_written(path: str) -> None:
    """Return once the writer of ``path`` has released its lock."""
    pause = FIRST_POLL_S
    while lock_is_held(path):
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_POLL_S)


def _generate(generate: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(generate)
    async def generate_after_write(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        outputs = generate(self, *args, **kwargs)
        try:
            async for output in outputs:
                path = (getattr(output, "kv_transfer_params", None) or {}).get(PATH_KEY)
                if path and getattr(output, "finished", False):
                    await until_written(str(path))
                yield output
        finally:
            # Closed early (client gone): close vLLM's generator now, which aborts the
            # request, rather than whenever it is collected.
            await outputs.aclose()  # type: ignore[attr-defined]

    return generate_after_write


def _probe() -> str | None:
    return (require_in_source(CONNECTOR, REPLY, LOCK_TAKEN, THREAD_WRITE)
            or require_in_source(ASYNC_LLM, GENERATE))


def _patch(patcher: Patcher) -> None:
    patcher.on_import(ASYNC_LLM, lambda module: patcher.wrap(module.AsyncLLM, "generate",
                                                             _generate))


ADAPTER = Adapter(
    id=ID,
    summary="the server's reply comes once the hidden-states file is written, as speculators "
    "0.5.0's client expects (AsyncLLM.generate)",
    why="from vLLM 0.24.0 the reply names a file a thread is still writing; speculators "
    "0.5.0's client moves it at once and fails with FileNotFoundError (0.6.0 on wait on "
    "<path>.lock)",
    how="wraps AsyncLLM.generate in the API server: a finished output with a "
    "hidden_states_path is yielded once the file's lock is free",
    upstream="vLLM 0.24.0: ExampleHiddenStatesConnector writes after request_finished, in a "
    "thread pool, behind a per-file <path>.lock",
    upstream_ref="none found: the asynchronous writer and its lock first appear in the vLLM "
    "0.24.0 wheel (load_hidden_states's docstring: 'Blocks (without polling) until the async "
    "write is complete')",
    vllm=spec(">=0.24.0"),
    speculators=spec("==0.5.*"),
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.5.0 is no longer supported",
)
