"""``SchedulerConfig`` requires the init-only ``is_encoder_decoder`` from vLLM 0.12.0.

speculators 0.3.0 extracts from decoder-only models, so ``False`` is the value
(speculators 0.4.0 passes the same). vLLM 0.11.0, which has no such field, ignores
unknown ``SchedulerConfig`` arguments (pydantic's default), so 0.4.0's needs nothing there.
"""

from __future__ import annotations

import re

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, module_source
from ...versions import spec
from ...wrappers import with_defaults

ID = "vllm.scheduler_config_is_encoder_decoder"


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
    why="SchedulerConfig(...) without is_encoder_decoder fails validation from vLLM 0.12.0",
    how="wraps the generator's SchedulerConfig with is_encoder_decoder=False as a default",
    upstream="vLLM 0.12.0: SchedulerConfig.is_encoder_decoder became a required InitVar",
    upstream_ref="vLLM PR #29859 (in 0.12.0): removed is_encoder_decoder's default, as "
    "vllm-ascend PR #4688 reports",
    vllm=spec(">=0.12.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported",
)
