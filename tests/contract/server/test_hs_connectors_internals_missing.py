"""hs-connectors 0.8.0/0.9.0's Mooncake and fp8 connectors on vLLM 0.17.0-0.21.0, which lack
``HiddenStateCacheSpec`` and ``ExampleHiddenStatesConnector._write_tensors`` (0.22.0+): raw, the
Mooncake connector's construction raises a bare ImportError and the fp8 connector writes
unquantized files without a word; with the adapter, vLLM's connector factory refuses both
with an ``UnsupportedConnectorError`` naming what is missing, and the stock connector builds.

The connectors are built the way vLLM builds them (``KVConnectorFactory.create_connector``
with the scheduler's and the worker's roles) from a real ``VllmConfig`` for a tiny Llama
(``EngineArgs(...).create_engine_config()``, no engine started) and a KV-cache config of the
engine's shape, with the real vLLM and the real hs-connectors. No end-to-end test: vLLM's CPU
builds up to 0.21 cannot run the server path at all (their model runner never sets the aux
layers: a ValueError at warm-up), so the start-up refusal is pinned here, where it happens.
Which vLLM names hs-connectors imports, per release:
tests/contract/facts/test_hs_connectors_imports.py.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.errors import UnsupportedConnectorError
from speccompat.record import ExtractionPath
from speccompat.server.adapters.hs_connectors_internals_missing import (
    CONNECTOR,
    FACTORY,
    HIDDEN_STATE_CACHE_SPEC,
    ID,
    INTERFACE,
    WRITE_TENSORS,
    _probe,
)
from speccompat.targets import module_source, source_def
from support import extract_engine_config, needs_adapter, requires_vllm, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.22.0+ has what hs-connectors uses; before 0.17.0 no "
                        "extract_hidden_states")
requires_hs_connectors = pytest.mark.skipif(
    importlib.util.find_spec("hs_connectors") is None, reason="hs-connectors is not installed")

MOONCAKE = ("MooncakeHiddenStatesConnector", "hs_connectors.mooncake_hidden_states_connector")
FP8 = ("FP8HiddenStatesConnector", "hs_connectors.fp8_hidden_states_connector")
STOCK = ("ExampleHiddenStatesConnector", None)


def _versions() -> tuple[str, str]:
    from importlib import metadata

    env = speccompat.detect()
    assert env.vllm is not None
    return str(env.vllm.version), metadata.version("hs-connectors")


@pytest.fixture(scope="module")
def engine_config(tiny_llama: Path) -> Any:
    """The VllmConfig ``vllm serve --speculative-config '{"method": "extract_hidden_states",
    ...}'`` builds, with the stock connector; built with speccompat's plugin off so this
    process stays raw (the tests apply the adapter themselves)."""
    config = extract_engine_config(
        tiny_llama, kv_transfer_config={"kv_connector": STOCK[0], "kv_role": "kv_producer"})
    assert ID not in registry.active(), "the plugin applied server-path adapters here"
    return config


def _with(config: Any, connector: tuple[str, str | None], storage: Path) -> Any:
    """``config`` asking for ``connector`` (name, ``kv_connector_module_path``)."""
    from vllm.config import KVTransferConfig

    name, module_path = connector
    changed = copy.copy(config)
    changed.kv_transfer_config = KVTransferConfig(
        kv_connector=name, kv_role="kv_producer", kv_connector_module_path=module_path,
        kv_connector_extra_config={"shared_storage_path": str(storage)})
    return changed


@pytest.fixture
def kv_cache_config(engine_config: Any) -> Any:
    """The engine's KV-cache layout for extract_hidden_states: the model's attention layers
    in one group, the cache-only hidden-states layer in its own (an MLA-shaped spec before
    0.22.0)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MLAAttentionSpec,
    )

    block = engine_config.cache_config.block_size
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(layers, FullAttentionSpec(block_size=block, num_kv_heads=2,
                                                   head_size=32, dtype=torch.bfloat16)),
        KVCacheGroupSpec(["cache_only_layers.4"], MLAAttentionSpec(
            block_size=block, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)),
    ])


def _build(config: Any, role: str, kv_cache_config: Any) -> Any:
    """What vLLM's scheduler (``role="SCHEDULER"``) and ``ensure_kv_transfer_initialized``
    in each worker (``"WORKER"``) do."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

    return KVConnectorFactory.create_connector(
        config=config, role=KVConnectorRole[role], kv_cache_config=kv_cache_config)


@pytest.fixture
def applied() -> Iterator[None]:
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        yield
    finally:
        speccompat.revert()


@vllm_in(">=0.17.0,<0.22.0", "0.22.0+ has both; before 0.17.0 neither connector module exists")
def test_raw_vllm_lacks_what_hs_connectors_use() -> None:
    interface = module_source(INTERFACE)
    assert interface is not None and "class HiddenStateCacheSpec(" not in interface
    assert source_def(CONNECTOR, "ExampleHiddenStatesConnector._write_tensors") is None
    save = source_def(CONNECTOR, "ExampleHiddenStatesConnector.save_kv_layer")
    assert save is not None and "safetensors.torch.save_file(" in save.text
    assert "_write_tensors" not in save.text
    factory = source_def(FACTORY, "KVConnectorFactory.create_connector")
    assert factory is not None and "connector_cls(config, role, kv_cache_config)" in factory.text
    assert _probe() is None


@applies
@requires_hs_connectors
@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_raw_mooncake_dies_with_a_bare_import_error(engine_config: Any, kv_cache_config: Any,
                                                    role: str, tmp_path: Path) -> None:
    """What users get without the adapter: an ImportError from inside the engine start."""
    assert ID not in registry.active()
    with pytest.raises(ImportError, match=r"HiddenStateCacheSpec") as raised:
        _build(_with(engine_config, MOONCAKE, tmp_path), role, kv_cache_config)
    assert not isinstance(raised.value, UnsupportedConnectorError)


@applies
@requires_hs_connectors
def test_raw_fp8_writes_unquantized_files_silently(engine_config: Any, kv_cache_config: Any,
                                                   tmp_path: Path) -> None:
    """The fp8 connector builds, and vLLM's save path writes the tensors itself: its
    ``_write_tensors`` override is never reached, so no fp8 and no ``hidden_states_scales``."""
    import torch
    from safetensors.torch import load_file
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionMetadata

    fp8 = pytest.importorskip(FP8[1], reason="hs-connectors < 0.9.0 has no fp8 connector")
    from hs_connectors.fp8_utils import SCALES_KEY

    connectors = importlib.import_module(CONNECTOR)
    assert "_write_tensors" in vars(fp8.FP8HiddenStatesConnector)
    assert "_write_tensors" not in vars(connectors.ExampleHiddenStatesConnector)

    connector = _build(_with(engine_config, FP8, tmp_path), "WORKER", kv_cache_config)
    assert type(connector) is fp8.FP8HiddenStatesConnector
    block = engine_config.cache_config.block_size
    # What register_kv_caches finds and what the scheduler's metadata carries for one
    # request of 5 tokens on block 1 of a paged cache [3 blocks, block, 2 states, 64].
    connector.cache_layers = ["cache_only_layers.4"]
    kv = torch.randn(3, block, 2, 64).to(torch.bfloat16)
    metadata = connectors.ExampleHiddenStatesConnectorMetadata()
    path = tmp_path / "req-0.safetensors"
    metadata.add_request("req-0", str(path), [7, 8, 9, 10, 11], [1], block)
    connector.bind_connector_metadata(metadata)
    slots = metadata.requests[0].slot_mapping
    connector.save_kv_layer("cache_only_layers.4", kv, CacheOnlyAttentionMetadata(slots))
    connector.wait_for_save()

    written = load_file(str(path))
    assert SCALES_KEY not in written
    assert set(written) == {"hidden_states", "token_ids"}
    assert written["hidden_states"].dtype == torch.bfloat16  # not float8_e4m3fn
    assert written["hidden_states"].equal(kv.flatten(0, 1)[block:block + 5])


@applies
@requires_hs_connectors
def test_hs_connectors_refused_naming_what_is_missing(engine_config: Any, kv_cache_config: Any,
                                                      applied: None, tmp_path: Path) -> None:
    vllm, hs_connectors = _versions()
    with pytest.raises(UnsupportedConnectorError) as mooncake:
        _build(_with(engine_config, MOONCAKE, tmp_path), "SCHEDULER", kv_cache_config)
    message = str(mooncake.value)
    for needle in (f"hs-connectors {hs_connectors}'s MooncakeHiddenStatesConnector",
                   f"vLLM {vllm}", HIDDEN_STATE_CACHE_SPEC, "vLLM >= 0.22.0",
                   "ExampleHiddenStatesConnector"):
        assert needle in message, (needle, message)
    assert not isinstance(mooncake.value, ImportError)
    # Raised in the engine core or a worker, it reaches the front end pickled.
    assert str(pickle.loads(pickle.dumps(mooncake.value))) == message

    if importlib.util.find_spec(FP8[1]) is None:
        return  # hs-connectors 0.8.0: no fp8 connector
    with pytest.raises(UnsupportedConnectorError) as fp8:
        _build(_with(engine_config, FP8, tmp_path), "WORKER", kv_cache_config)
    message = str(fp8.value)
    for needle in (f"hs-connectors {hs_connectors}'s FP8HiddenStatesConnector", f"vLLM {vllm}",
                   WRITE_TENSORS, "quantization silently skipped", "hidden_states_scales",
                   "vLLM >= 0.22.0"):
        assert needle in message, (needle, message)

    # A user's subclass of one of them is refused the same way, naming both.
    fp8_cls = importlib.import_module(FP8[1]).FP8HiddenStatesConnector
    mine = type("MyConnector", (fp8_cls,), {"__module__": "my_connectors"})
    from speccompat.server.adapters.hs_connectors_internals_missing import check_connector

    with pytest.raises(UnsupportedConnectorError, match=r"MyConnector \(a FP8HiddenStates"):
        check_connector(mine)


@applies
def test_the_stock_connector_still_builds(engine_config: Any, kv_cache_config: Any,
                                          applied: None, tmp_path: Path) -> None:
    connectors = importlib.import_module(CONNECTOR)
    for role in ("SCHEDULER", "WORKER"):
        built = _build(_with(engine_config, STOCK, tmp_path), role, kv_cache_config)
        assert type(built) is connectors.ExampleHiddenStatesConnector


@applies
@requires_hs_connectors
def test_fails_without_it(engine_config: Any, kv_cache_config: Any, tmp_path: Path) -> None:
    """Applied, the refusal; reverted, the bare ImportError again."""
    config = _with(engine_config, MOONCAKE, tmp_path)
    registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        with pytest.raises(UnsupportedConnectorError):
            _build(config, "SCHEDULER", kv_cache_config)
    finally:
        speccompat.revert()
    with pytest.raises(ImportError, match=r"HiddenStateCacheSpec"):
        _build(config, "SCHEDULER", kv_cache_config)


@applies
def test_doctor_shows_it_on_the_server_path() -> None:
    verdict = {o.adapter: o for o in registry.server_verdict()}
    assert verdict[ID].state is speccompat.State.SKIPPED
    assert "applies inside vllm serve" in verdict[ID].reason


@vllm_in(">=0.22.0", "the releases before 0.22.0 are the ones it is for")
def test_not_selected_from_0_22() -> None:
    wanted, why = next(a for a in speccompat.catalogue() if a.id == ID).wants(speccompat.detect())
    assert not wanted, why
    mismatch = _probe()
    assert mismatch is not None
    assert HIDDEN_STATE_CACHE_SPEC in mismatch and WRITE_TENSORS in mismatch
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.NOT_NEEDED
        assert ID not in registry.active()
    finally:
        speccompat.revert()
    verdict = {o.adapter: o for o in registry.server_verdict()}
    assert verdict[ID].state is speccompat.State.NOT_NEEDED
