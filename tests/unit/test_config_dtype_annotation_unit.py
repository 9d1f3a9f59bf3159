"""config_dtype_annotation: the probe reads sources only; the patch gives
``reload_schema`` the ``torch`` namespace, deferred until speculators' module loads."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from speccompat.inprocess.adapters import config_dtype_annotation as adapter
from speccompat.patching import Patcher, patched_by
from speccompat.record import Side
from speccompat.versions import spec

PYDANTIC_UTILS = '''
class ReloadableBaseModel:
    rebuilds = []

    @classmethod
    def model_rebuild(cls, **kwargs):
        cls.rebuilds.append((cls, kwargs))

    @classmethod
    def reload_schema(cls):
        cls.model_rebuild(force=True)


class Config(ReloadableBaseModel):
    pass
'''
# transformers 5.18+ (with ``from __future__ import annotations``) and 5.5.3-5.17.
CONFIGURATION_5_18 = '''from __future__ import annotations
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class PreTrainedConfig:
    dtype: str | torch.dtype | None = None
'''
CONFIGURATION_5_5 = CONFIGURATION_5_18.replace(
    "str | torch.dtype | None", 'Union[str, "torch.dtype"] | None')
# transformers 4.57: dtype is an __init__ argument, not a class annotation.
CONFIGURATION_4 = '''from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:
    import torch


class PretrainedConfig:
    def __init__(
        self,
        dtype: Optional[Union[str, "torch.dtype"]] = None,
    ):
        self.dtype = dtype
'''


@pytest.fixture
def upstream(
    module_dir: Path, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], str]:
    """Throwaway stand-ins for the two upstream modules; returns the pydantic_utils name."""
    speculators, transformers = unique_name("speculators"), unique_name("transformers")
    for package in (speculators, transformers):
        (module_dir / package).mkdir()
    (module_dir / speculators / "__init__.py").write_text("")
    (module_dir / transformers / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (module_dir / speculators / "pydantic_utils.py").write_text(PYDANTIC_UTILS)
    monkeypatch.setattr(adapter, "PYDANTIC_UTILS", f"{speculators}.pydantic_utils")
    monkeypatch.setattr(adapter, "TRANSFORMERS_CONFIG", f"{transformers}.configuration_utils")

    def with_configuration(source: str) -> str:
        (module_dir / transformers / "configuration_utils.py").write_text(source)
        return adapter.PYDANTIC_UTILS

    return with_configuration


@pytest.mark.parametrize("source", [CONFIGURATION_5_18, CONFIGURATION_5_5])
def test_probe_accepts_transformers_5(upstream: Callable[[str], str], source: str) -> None:
    upstream(source)
    assert adapter._probe() is None


def test_probe_rejects_transformers_4(upstream: Callable[[str], str]) -> None:
    upstream(CONFIGURATION_4)
    assert adapter._probe() == (
        f"{adapter.TRANSFORMERS_CONFIG} has no class-level 'dtype: ... torch.dtype' annotation")


def test_probe_rejects_torch_imported_at_runtime(upstream: Callable[[str], str]) -> None:
    upstream(CONFIGURATION_5_18.replace("if TYPE_CHECKING:\n    import torch", "import torch"))
    assert "no longer contains" in (adapter._probe() or "")


def test_probe_rejects_a_changed_reload_schema(
    upstream: Callable[[str], str], module_dir: Path,
) -> None:
    name = upstream(CONFIGURATION_5_18)
    path = module_dir.joinpath(*name.split(".")).with_suffix(".py")
    path.write_text(PYDANTIC_UTILS.replace("cls.model_rebuild(force=True)",
                                           "cls.model_rebuild(force=True, _types_namespace={})"))
    assert f"{name} no longer contains" in (adapter._probe() or "")


def test_probe_without_speculators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "PYDANTIC_UTILS", "sc_unit_absent_pkg.pydantic_utils")
    assert adapter._probe() == "sc_unit_absent_pkg.pydantic_utils is not installed"


def test_patch_waits_for_the_module_and_passes_torch(
    upstream: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = upstream(CONFIGURATION_5_18)
    patcher = Patcher(adapter.ID)
    adapter._patch(patcher)
    assert patcher.waiting_for == [name]
    fake_torch = types.ModuleType("torch")
    with monkeypatch.context() as m:  # undone before the suite checks that torch stayed out
        m.setitem(sys.modules, "torch", fake_torch)
        module = importlib.import_module(name)
        assert patcher.waiting_for == []
        reload_schema = vars(module.ReloadableBaseModel)["reload_schema"]
        assert isinstance(reload_schema, classmethod) and patched_by(reload_schema) == adapter.ID
        module.Config.reload_schema()
    assert module.ReloadableBaseModel.rebuilds == [
        (module.Config, {"force": True, "_types_namespace": {"torch": fake_torch}})]
    patcher.revert()
    restored = vars(module.ReloadableBaseModel)["reload_schema"]
    assert patched_by(restored) is None
    assert restored.__func__ is reload_schema.__func__.__wrapped__  # type: ignore[attr-defined]
    module.Config.reload_schema()
    assert module.ReloadableBaseModel.rebuilds[-1] == (module.Config, {"force": True})
    sys.modules.pop(name, None)


def test_the_record() -> None:
    record = adapter.ADAPTER
    assert record.id == adapter.ID and record.side is Side.BOTH
    # Selected by transformers, the cause: any vLLM it is paired with (vLLM 0.19.1-0.23.x
    # accept transformers 5 too).
    assert record.vllm is None and record.cause == "transformers"
    assert record.transformers == spec(">=5.4.0")
    assert all(v in record.transformers for v in ("5.4.0", "5.5.3", "5.24.0", "5.30.0.dev0"))
    assert not any(v in record.transformers for v in ("4.57.6", "5.3.0"))
    assert record.speculators is not None
    assert all(v in record.speculators for v in ("0.3.0", "0.4.0"))
    assert not any(v in record.speculators for v in ("0.2.0", "0.5.0"))
