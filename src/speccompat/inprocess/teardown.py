"""Shutting down an executor whose workers failed, without hanging the caller.

After a worker failure, vLLM 0.22's ``MultiprocExecutor.shutdown`` leaves the zmq
contexts behind its message queues open, each with a message pending for the dead
worker. Whoever collects them later (garbage collection, interpreter exit) blocks in
zmq's context termination forever: the user's script never returns. The executor is
unusable anyway once a worker failed, so it is shut down at once and its contexts are
destroyed without lingering, which drops the pending messages.
"""

from __future__ import annotations

import contextlib
from typing import Any


def shut_down(executor: Any) -> None:
    """``executor.shutdown()``, then its message queues' zmq contexts destroyed, linger 0."""
    contexts = queue_contexts(executor)
    with contextlib.suppress(Exception):  # a half-dead executor may fail its own shutdown
        executor.shutdown()
    for context in contexts:
        if not context.closed:
            context.destroy(linger=0)


def queue_contexts(executor: Any) -> list[Any]:
    """The zmq contexts behind an executor's message queues (sockets sit one level down:
    on the queue, or on its reader/writer handles)."""
    try:
        import zmq
    except ImportError:  # no zmq, no multiproc executor
        return []
    queues = [getattr(executor, "rpc_broadcast_mq", None),
              *(getattr(executor, "response_mqs", None) or [])]
    contexts: list[Any] = []
    for queue in filter(None, queues):
        for value in vars(queue).values():
            for obj in [value, *getattr(value, "__dict__", {}).values()]:
                if isinstance(obj, zmq.Socket) and obj.context not in contexts:
                    contexts.append(obj.context)
    return contexts
