"""The ``vllm.general_plugins`` entry point: speccompat inside vLLM's own processes.

vLLM loads general plugins in the frontend, in the engine core and in each
worker (spawned ones too) before the worker and its extension class are built.

- In-process path: the parent's ``apply()`` leaves the ids it applied in an
  environment variable that those processes inherit; here they are applied again,
  worker side only.
- Server path: where the engine is asked for ``extract_hidden_states``
  (``speccompat.server``), the server-path adapters are applied, and the answer is
  handed to vLLM's child processes.

Any other process is left untouched, and ``SPECCOMPAT_DISABLE=1`` turns both off.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from . import registry, server
from .record import ExtractionPath, Side

log = logging.getLogger("speccompat")
# A child of vLLM's "vllm" logger, which has its handler and format in every vLLM process.
SERVER_LOG = "vllm.speccompat"


def requested() -> list[str]:
    """Adapter ids the parent process applied, as handed down to this one."""
    raw = os.environ.get(registry.ACTIVE_ENV, "")
    if not raw:
        return []
    try:
        ids = json.loads(raw)
    except json.JSONDecodeError:
        ids = None
    if not isinstance(ids, list):
        log.warning("ignoring malformed %s=%r", registry.ACTIVE_ENV, raw)
        return []
    return [i for i in ids if isinstance(i, str)]


def load() -> None:
    if registry.disabled():
        return
    ids = requested()
    if ids:
        known = {a.id for a in registry.catalogue()}
        report = registry._apply(
            only=[i for i in ids if i in known],
            sides=(Side.WORKER, Side.BOTH),
            judge_support=False,
        )
        log.debug("plugin: active here: %s", ", ".join(report.applied) or "none")
    if server.requested(sys._getframe(1)):
        load_server_path()


def load_server_path() -> None:
    """The server-path adapters in this process, and the answer for its children."""
    inherited = os.environ.get(server.SERVER_ENV) == "1"
    os.environ[server.SERVER_ENV] = "1"
    report = registry._apply(paths=(ExtractionPath.SERVER,), judge_support=False)
    if not inherited:  # one line per server: the process that found the method
        from . import __version__

        line = (f"speccompat {__version__}: {server.METHOD} requested; server-path adapters "
                f"applied: {', '.join(report.applied) or 'none'}")
        logger = logging.getLogger(SERVER_LOG)
        if logger.hasHandlers():
            # Through vLLM's own logger, so the line stands in the server's log with the rest.
            logger.info(line)
        else:
            # vLLM >= 0.32 configures its logging from the parsed arguments, after this first
            # plugin load: an INFO record now would be dropped.
            print(f"INFO [speccompat] {line}", file=sys.stderr, flush=True)
