"""``Request.__init__`` lost ``eos_token_id`` in vLLM 0.17.0; the EOS id now lives on the
sampling params ("Request.eos_token_id will be removed in v0.18. Please use
Request.sampling_params.eos_token_id instead.").

speculators 0.3.0 still passes it; the id moves to the sampling params the way
vLLM's own input processor puts it there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, source_def
from ...versions import spec

ID = "vllm.request_eos_token_id_removed"


def _eos_on_sampling_params(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def build(*args: Any, **kwargs: Any) -> Any:
        eos_token_id = kwargs.pop("eos_token_id", None)
        sampling_params = kwargs.get("sampling_params")
        if eos_token_id is not None and sampling_params is not None:
            sampling_params.update_from_generation_config({}, eos_token_id)
        return original(*args, **kwargs)

    return build


def _probe() -> str | None:
    init = source_def("vllm.v1.request", "Request.__init__")  # read, not imported
    if init is None:
        return "vllm.v1.request defines no Request.__init__"
    if "eos_token_id" in init.params:
        return "Request.__init__ still takes eos_token_id"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "Request", _eos_on_sampling_params)


ADAPTER = Adapter(
    id=ID,
    summary="speculators' Request(eos_token_id=...) puts the EOS id on the sampling params",
    why="speculators' Request(eos_token_id=...) raises TypeError from vLLM 0.17.0",
    how="wraps the generator's Request to move eos_token_id onto the sampling params "
    "(update_from_generation_config)",
    upstream="vLLM 0.17.0: Request.__init__ no longer takes eos_token_id",
    upstream_ref="none found: no PR located for the 0.17.0 signature change; vLLM PR #36470 later "
    "removed the deprecated Request.eos_token_id attribute",
    vllm=spec(">=0.17.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
