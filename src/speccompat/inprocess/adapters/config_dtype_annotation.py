"""speculators 0.3.0/0.4.0 cannot be imported under transformers 5: the one vLLM requires
from 0.24.0 (``transformers>=5.5.3``), and the one pip resolves beside speculators 0.3.0
on vLLM 0.19.1 to 0.23.x, which accept both majors.

transformers 5 declares ``PreTrainedConfig``'s fields as class annotations, among
them ``dtype: Union[str, "torch.dtype"] | None`` with ``torch`` imported only under
``TYPE_CHECKING``. ``SpeculatorModelConfig`` is a pydantic model that subclasses
``PretrainedConfig``, so pydantic makes that a field; at import time
``speculators.reload_and_populate_configs()`` calls ``reload_schema()``, whose
``model_rebuild(force=True)`` resolves the string in speculators' own module, where
there is no ``torch``: ``PydanticUndefinedAnnotation: name 'torch' is not defined``.

``reload_schema`` is given the ``torch`` that annotation means, as the types
namespace pydantic resolves from; nothing else changes and every other error
still raises.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import module_source, require_in_source
from ...versions import spec

ID = "transformers.config_dtype_annotation"
PYDANTIC_UTILS = "speculators.utils.pydantic_utils"
TRANSFORMERS_CONFIG = "transformers.configuration_utils"
_DTYPE_FIELD = re.compile(r"^    dtype: .*torch\.dtype", re.MULTILINE)


def _rebuild_with_torch(original: Callable[..., Any]) -> Callable[..., Any]:
    # ``original`` is the upstream body, ``cls.model_rebuild(force=True)``; it cannot be
    # handed a namespace, so the same call is made here with one.
    @functools.wraps(original)
    def reload_schema(cls: Any) -> None:
        import torch

        cls.model_rebuild(force=True, _types_namespace={"torch": torch})

    return reload_schema


def _probe() -> str | None:
    found = require_in_source(PYDANTIC_UTILS, "cls.model_rebuild(force=True)")
    if found is not None:
        return found
    # transformers 4 takes dtype as an __init__ argument, not as a class annotation.
    source = module_source(TRANSFORMERS_CONFIG) or ""
    if not _DTYPE_FIELD.search(source):
        return f"{TRANSFORMERS_CONFIG} has no class-level 'dtype: ... torch.dtype' annotation"
    return require_in_source(TRANSFORMERS_CONFIG, "if TYPE_CHECKING:\n    import torch")


def _patch(patcher: Patcher) -> None:
    def hook(module: ModuleType) -> None:
        patcher.wrap(module.ReloadableBaseModel, "reload_schema", _rebuild_with_torch)

    patcher.on_import(PYDANTIC_UTILS, hook)


ADAPTER = Adapter(
    id=ID,
    summary="speculators' config schemas resolve transformers 5's 'torch.dtype' annotation, "
    "so speculators imports",
    why="without it speculators does not import (PydanticUndefinedAnnotation: name 'torch' is not "
    "defined): neither the generator in the driver nor the worker extension each vLLM worker "
    "imports",
    how="wraps speculators' ReloadableBaseModel.reload_schema to rebuild the schema with torch in "
    "pydantic's types namespace",
    upstream="transformers 5.4.0: PreTrainedConfig declares its fields as class annotations, "
    "'dtype' as 'torch.dtype' with torch imported only for type checkers (taken by every "
    "vLLM >= 0.24.0, and by default beside speculators 0.3.0 on vLLM 0.19.1-0.23.x)",
    upstream_ref="none found: the class-level 'dtype' annotation first appears in the "
    "transformers 5.4.0 wheel; no PR or release note for it was located",
    vllm=None,
    transformers=spec(">=5.4.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
