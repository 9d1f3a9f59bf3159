"""tests/serving.py's ``module_installed``: a presence check that never imports the package
(speculators 0.3.0/0.4.0 raise at import under transformers >= 5.4 without speccompat)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import serving


@pytest.fixture
def package_that_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "speccompat_probe_pkg"
    root = tmp_path / name
    (root / "data_generation").mkdir(parents=True)
    (root / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (root / "data_generation" / "__init__.py").write_text("")
    (root / "data_generation" / "generator.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_finds_a_submodule_without_importing(package_that_raises: str) -> None:
    assert serving.module_installed(f"{package_that_raises}.data_generation.generator")
    assert serving.module_installed(f"{package_that_raises}.data_generation")
    assert serving.module_installed(package_that_raises)
    assert package_that_raises not in sys.modules


def test_missing_submodule_or_package(package_that_raises: str) -> None:
    assert not serving.module_installed(f"{package_that_raises}.data_generation.removed")
    assert not serving.module_installed("speccompat_no_such_package.anything")
    assert package_that_raises not in sys.modules
