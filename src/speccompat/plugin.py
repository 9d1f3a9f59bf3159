"""The ``vllm.general_plugins`` entry point: worker-side adapters in every vLLM process.

vLLM loads general plugins in the frontend, in the engine core and in each
worker (spawned ones too) before the worker and its extension class are built.
The parent's ``apply()`` leaves the ids it applied in an environment variable
that those processes inherit; here they are applied again, worker side only.
A process whose parent never called ``apply()`` is left untouched.
"""

from __future__ import annotations

import json
import logging

from . import registry
from .record import Side

log = logging.getLogger("speccompat")


def requested() -> list[str]:
    """Adapter ids the parent process applied, as handed down to this one."""
    import os

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
    ids = requested()
    if not ids:
        return
    known = {a.id for a in registry.catalogue()}
    report = registry.apply(
        only=[i for i in ids if i in known],
        sides=(Side.WORKER, Side.BOTH),
        judge_support=False,
    )
    log.debug("plugin: active here: %s", ", ".join(report.applied) or "none")
