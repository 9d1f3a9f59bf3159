"""hs-connectors 0.8.0/0.9.0 (speculators 0.8.0/0.9.0's Mooncake and fp8 hidden-state
connectors, loaded inside ``vllm serve`` through ``kv_connector_module_path``) are written
against vLLM internals that first appear in vLLM 0.22.0, and vLLM 0.17.0-0.21.0 accept them
anyway (docs/server-path-facts.md):

- ``MooncakeHiddenStatesConnector`` imports ``vllm.v1.kv_cache_interface.HiddenStateCacheSpec``
  when it is built with a KV-cache config, which vLLM's scheduler always passes: the engine
  dies at start-up with a bare ImportError from deep inside the engine core.
- ``FP8HiddenStatesConnector`` overrides ``ExampleHiddenStatesConnector._write_tensors`` to
  quantize; before 0.22.0 vLLM's ``save_kv_layer`` writes the files itself and never calls it,
  so the server writes unquantized files without ``hidden_states_scales``, and no one notices.

Where vLLM builds its KV connector (``KVConnectorFactory.create_connector``, in the engine
core's scheduler and in every worker, before any request), a connector class from the
``hs_connectors`` package (or a subclass of one) is refused with an
:class:`~speccompat.errors.UnsupportedConnectorError` naming the hs-connectors and vLLM
versions, the missing vLLM internal and what to do. Every other connector is built as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import metadata
from typing import Any

from ...errors import UnsupportedConnectorError
from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import HIDDEN_STATES_CONNECTOR, module_source, require_in_source
from ...versions import detect, spec

ID = "vllm.hs_connectors_internals_missing"
FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"
CONNECTOR = HIDDEN_STATES_CONNECTOR
INTERFACE = "vllm.v1.kv_cache_interface"
PACKAGE = "hs_connectors"
FIXED_IN = "0.22.0"
HIDDEN_STATE_CACHE_SPEC = f"{INTERFACE}.HiddenStateCacheSpec"
WRITE_TENSORS = f"{CONNECTOR}.ExampleHiddenStatesConnector._write_tensors"
# hs-connectors' connector classes -> (the vLLM internal each needs, what happens without it).
NEEDS: dict[str, tuple[str, str]] = {
    "MooncakeHiddenStatesConnector": (
        HIDDEN_STATE_CACHE_SPEC,
        "it imports it when it is built, so the engine would die at start-up with an "
        "ImportError"),
    "FP8HiddenStatesConnector": (
        f"the hook it overrides to quantize, {WRITE_TENSORS}",
        "vLLM would write the files itself without calling the override: fp8 quantization "
        "silently skipped, files unquantized and without hidden_states_scales"),
}
# A connector class hs-connectors 0.8.0/0.9.0 did not have.
ANY = (f"the vLLM internals hs-connectors is written against ({HIDDEN_STATE_CACHE_SPEC}, "
       f"{WRITE_TENSORS})", "it would fail at start-up or write wrong files")


def hs_connectors_class(connector_cls: type) -> type | None:
    """The first class in ``connector_cls``'s MRO that hs-connectors defines, if any."""
    for cls in connector_cls.__mro__:
        module = getattr(cls, "__module__", "") or ""
        if module == PACKAGE or module.startswith(f"{PACKAGE}."):
            return cls
    return None


def _hs_connectors_version() -> str:
    try:
        return metadata.version("hs-connectors")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def check_connector(connector_cls: type) -> None:
    """Refuse one of hs-connectors' connectors: this vLLM lacks what it needs."""
    ours = hs_connectors_class(connector_cls)
    if ours is None:
        return
    missing, consequence = NEEDS.get(ours.__name__, ANY)
    name = (ours.__name__ if ours is connector_cls
            else f"{connector_cls.__name__} (a {ours.__name__})")
    env = detect()
    found = f"vLLM {env.vllm.version}" if env.vllm is not None else "this vLLM"
    raise UnsupportedConnectorError(
        connector=f"hs-connectors {_hs_connectors_version()}'s {name}",
        found=found,
        missing=missing,
        consequence=consequence,
        supported=f"hs-connectors' connectors on vLLM >= {FIXED_IN}",
        advice=f"Install vLLM >= {FIXED_IN}, or serve with vLLM's stock connector: "
        "--kv-transfer-config '{\"kv_connector\": \"ExampleHiddenStatesConnector\", ...}' "
        "without kv_connector_module_path.",
    )


def _guarded(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    def create_connector(cls: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        transfer = getattr(config, "kv_transfer_config", None)
        if transfer is not None:  # without one, vLLM's own error stands
            check_connector(cls.get_connector_class(transfer))
        return create(cls, config, *args, **kwargs)

    return create_connector


def _probe() -> str | None:
    missing = require_in_source(FACTORY, "def create_connector(", "def get_connector_class(")
    if missing is not None:
        return missing
    connector, interface = module_source(CONNECTOR), module_source(INTERFACE)
    if connector is None or interface is None:
        return f"{CONNECTOR if connector is None else INTERFACE} is not installed"
    present = [name for name, found in (
        (HIDDEN_STATE_CACHE_SPEC, "class HiddenStateCacheSpec(" in interface),
        (WRITE_TENSORS, "def _write_tensors(" in connector)) if found]
    if present:
        return f"vLLM defines {', '.join(present)}: hs-connectors' connectors have what they need"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.on_import(FACTORY, lambda factory: patcher.wrap(
        factory.KVConnectorFactory, "create_connector", _guarded))


ADAPTER = Adapter(
    id=ID,
    summary="hs-connectors' Mooncake and fp8 connectors are refused at engine start-up on the "
    "vLLM releases that lack the internals they need",
    why="the Mooncake connector dies in __init__ with a bare ImportError of HiddenStateCacheSpec "
    "deep in the engine start; the fp8 connector starts, but vLLM never calls its "
    "_write_tensors, so the files come out unquantized without hidden_states_scales, silently",
    how="wraps KVConnectorFactory.create_connector (engine core's scheduler and every worker) to "
    "raise UnsupportedConnectorError for a connector class from hs_connectors",
    upstream="vLLM 0.22.0: HiddenStateCacheSpec (kv_cache_interface) and the asynchronous "
    "writer's ExampleHiddenStatesConnector._write_tensors, both absent in 0.17.0-0.21.0, which "
    "hs-connectors 0.8.0/0.9.0 use",
    upstream_ref="vLLM PR #39949 (HiddenStateCacheSpec, per vLLM PR #46301's and vllm-ascend PR "
    "#9763's descriptions) and vLLM PR #43805 (the asynchronous writer, per vLLM PR #46301's "
    "description); both first in the 0.22.0 wheel",
    vllm=spec(">=0.17.0,<0.22.0"),
    speculators=None,
    side=Side.BOTH,
    probe=_probe,
    patch=_patch,
    remove_when="speccompat no longer supports vLLM < 0.22.0 on the server path",
)
