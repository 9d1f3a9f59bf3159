"""Whether this vLLM process serves ``extract_hidden_states``: the server path's switch.

speculators >= 0.5 extract through ``vllm serve --speculative-config
'{"method": "extract_hidden_states", ...}'``. Nobody calls ``apply()`` there: the
``vllm.general_plugins`` entry point runs in the API server, the engine core and every
worker, and applies the server-path adapters only where this module says the engine was
asked for ``extract_hidden_states``. Everywhere else speccompat patches nothing.

vLLM loads general plugins once per process, and in the API server that first load comes
before the arguments are parsed (``AsyncEngineArgs.add_cli_args``), so the answer is read
from, in order: what the parent process found (``SPECCOMPAT_EXTRACT_HIDDEN_STATES``, which
vLLM's spawned engine core and workers inherit); the command line (``vllm serve`` and
``python -m vllm.entrypoints.openai.api_server``); and the ``vllm_config`` or engine
arguments of the vLLM frame that loaded the plugins (engine core, worker, ``LLM(...)``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

METHOD = "extract_hidden_states"
# Set by the process that found the method; its vLLM children inherit it.
SERVER_ENV = "SPECCOMPAT_EXTRACT_HIDDEN_STATES"
_FLAGS = ("--speculative-config", "--speculative_config", "-sc")
# How far up from the plugin call to look for vLLM's own frame (plugin.load <- the
# entry point loop <- load_general_plugins <- the vLLM caller, plus some slack).
_FRAMES = 8


def requested(frame: FrameType | None = None) -> bool:
    """True when this process's vLLM engine was asked for ``extract_hidden_states``."""
    if os.environ.get(SERVER_ENV) == "1":
        return True
    if in_argv(sys.argv):
        return True
    return in_frames(frame if frame is not None else sys._getframe(1))


def in_argv(argv: Sequence[str]) -> bool:
    """``--speculative-config '{"method": "extract_hidden_states", ...}'`` (also
    ``--speculative-config=...``, ``-sc``, and vLLM's dotted
    ``--speculative-config.method extract_hidden_states``)."""
    for at, token in enumerate(argv):
        flag, eq, value = token.partition("=")
        if flag in _FLAGS or any(flag.startswith(f + ".") for f in _FLAGS):
            if not eq:
                value = argv[at + 1] if at + 1 < len(argv) else ""
            if flag.endswith(".method"):
                if value == METHOD:
                    return True
            elif _method_of(value) == METHOD:
                return True
    return False


def in_frames(frame: FrameType | None) -> bool:
    """A ``vllm_config`` (engine core, worker) or engine arguments (``self`` of
    ``EngineArgs``) in one of the frames above ``frame`` that asks for the method."""
    for _ in range(_FRAMES):
        if frame is None:
            return False
        local = frame.f_locals
        spec = getattr(local.get("vllm_config"), "speculative_config", None)
        if spec is not None:
            return _method_of(spec) == METHOD
        owner = local.get("self")
        if type(owner).__name__.endswith("EngineArgs"):
            return _method_of(getattr(owner, "speculative_config", None)) == METHOD
        frame = frame.f_back
    return False


def _method_of(spec: Any) -> str | None:
    """The ``method`` of a speculative config given as JSON text, a dict or an object."""
    if spec is None:
        return None
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return None
    method = spec.get("method") if isinstance(spec, dict) else getattr(spec, "method", None)
    return method if isinstance(method, str) else None
