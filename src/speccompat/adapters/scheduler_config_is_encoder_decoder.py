"""``SchedulerConfig`` requires the init-only ``is_encoder_decoder`` from vLLM 0.12.0.

speculators 0.3.0 extracts from decoder-only models, so ``False`` is the value
(speculators 0.4.0 passes the same). vLLM 0.11.0, which has no such field, ignores
unknown ``SchedulerConfig`` arguments (pydantic's default), so 0.4.0's needs nothing there.
"""

from __future__ import annotations

import re

from ..patching import Patcher
from ..registry import Adapter, Side
from ..targets import GENERATOR, module_source
from ..versions import spec
from ..wrappers import with_defaults

ID = "vllm.scheduler_config.is_encoder_decoder_required"


_REQUIRED_FIELD = re.compile(r"^    is_encoder_decoder: InitVar\[bool\]\s*$", re.MULTILINE)


def _probe() -> str | None:
    # Read, not imported: importing vllm.config costs seconds in apply().
    if not _REQUIRED_FIELD.search(module_source("vllm.config.scheduler") or ""):
        return "SchedulerConfig does not require is_encoder_decoder"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "SchedulerConfig",
                           lambda original: with_defaults(original, is_encoder_decoder=False))


ADAPTER = Adapter(
    id=ID,
    summary="SchedulerConfig(...) built by speculators 0.3.0 gets is_encoder_decoder=False",
    upstream="vLLM 0.12.0: SchedulerConfig.is_encoder_decoder became a required InitVar",
    vllm=spec(">=0.12.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
