"""cuda_wheels: the CUDA 12 wheels an earlier torch left behind, and cuda-bindings shadowed by
cuda-python of old, as doctor reports them."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speccompat.cuda_wheels import shadowed_cuda_bindings, stale_cuda_wheels


@dataclass
class FakeDistribution:
    name: str
    version: str = "1.0"
    requires: list[str] | None = field(default_factory=list)

    @property
    def metadata(self) -> dict[str, str]:
        return {"Name": self.name}


def dists(*items: FakeDistribution) -> list[Any]:
    return list(items)


# torch 2.11.0 on PyPI (Linux): the CUDA 13 wheels, a few of them named with -cu13.
TORCH_2_11 = FakeDistribution("torch", "2.11.0", [
    'nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
    'cuda-toolkit[cublas]==13.0.2; platform_system == "Linux"',
])
CUDA_13 = [FakeDistribution("nvidia-cudnn-cu13", requires=["nvidia-cublas"]),
           FakeDistribution("cuda-toolkit", requires=["nvidia-cublas; extra == 'cublas'"]),
           FakeDistribution("nvidia-cublas")]
# What speculators 0.4.0's torch 2.10.0 brought, left after vLLM moved torch to 2.11.0.
CUDA_12_LEFT = [FakeDistribution("nvidia-cusolver-cu12", requires=["nvidia-cublas-cu12"]),
                FakeDistribution("nvidia-cublas-cu12"),
                FakeDistribution("nvidia-cudnn-cu12", requires=["nvidia-cublas-cu12"])]


def test_a_clean_install_has_none() -> None:
    assert stale_cuda_wheels(dists(TORCH_2_11, *CUDA_13)) is None


def test_without_torch_there_is_nothing_to_say() -> None:
    assert stale_cuda_wheels(dists(*CUDA_12_LEFT)) is None


def test_the_cuda_12_wheels_left_behind_are_stale_transitively() -> None:
    found = stale_cuda_wheels(dists(TORCH_2_11, *CUDA_13, *CUDA_12_LEFT,
                                    FakeDistribution("torchcodec", "0.17.0")))
    assert found is not None
    # nvidia-cublas-cu12 is required, but only by other stale wheels.
    assert found.stale == ("nvidia-cublas-cu12", "nvidia-cudnn-cu12", "nvidia-cusolver-cu12")
    assert found.torch == "2.11.0" and found.torchcodec
    assert "nvidia-cudnn-cu13" in found.reinstall and "nvidia-cublas" in found.reinstall
    message = found.message
    assert "import vllm` fails from vLLM 0.25.0 on" in message
    assert ("pip uninstall -y nvidia-cublas-cu12 nvidia-cudnn-cu12 nvidia-cusolver-cu12 && "
            "pip install --force-reinstall --no-deps nvidia-cublas nvidia-cudnn-cu13") in message


def test_cuda_12_wheels_torch_still_needs_are_not_stale() -> None:
    torch_2_10 = FakeDistribution("torch", "2.10.0", ["nvidia-cusolver-cu12", "nvidia-cudnn-cu12"])
    assert stale_cuda_wheels(dists(torch_2_10, *CUDA_12_LEFT)) is None


def test_without_torchcodec_it_is_a_note() -> None:
    found = stale_cuda_wheels(dists(TORCH_2_11, *CUDA_13, *CUDA_12_LEFT))
    assert found is not None and not found.torchcodec
    assert "would not load" in found.message


# vLLM 0.33.0 asks for an extra of a dependency; the wheel that extra brings is needed.
VLLM_0_33 = FakeDistribution("vllm", "0.33.0", ["nvidia-cutlass-dsl[cu13]==4.8.0"])
CUTLASS_DSL = [
    FakeDistribution("nvidia-cutlass-dsl", "4.8.0", [
        "nvidia-cutlass-dsl-libs-base==4.8.0",
        "nvidia-cutlass-dsl-libs-cu12==4.8.0",
        'nvidia-cutlass-dsl-libs-cu13==4.8.0; extra == "cu13"',
        'nvidia-cutlass-dsl-libs-qnx-cu13==4.8.0; extra == "qnx-cu13"',
    ]),
    FakeDistribution("nvidia-cutlass-dsl-libs-base", "4.8.0"),
    FakeDistribution("nvidia-cutlass-dsl-libs-cu12", "4.8.0"),
    FakeDistribution("nvidia-cutlass-dsl-libs-cu13", "4.8.0"),
]


def test_a_wheel_required_through_an_asked_extra_is_not_stale() -> None:
    """Seen in the matrix cell vLLM 0.33.0 x speculators 0.9.0: doctor called
    nvidia-cutlass-dsl-libs-cu13 stale, its fix removed it, and vLLM's GPU runner no longer
    imported (cuda.bindings.runtime has no cudaLibrary_t)."""
    assert stale_cuda_wheels(dists(TORCH_2_11, *CUDA_13, VLLM_0_33, *CUTLASS_DSL)) is None


def test_an_extra_nobody_asks_for_brings_nothing() -> None:
    qnx = FakeDistribution("nvidia-cutlass-dsl-libs-qnx-cu13", "4.8.0")
    found = stale_cuda_wheels(dists(TORCH_2_11, *CUDA_13, VLLM_0_33, *CUTLASS_DSL, qnx))
    assert found is not None and found.stale == ("nvidia-cutlass-dsl-libs-qnx-cu13",)


def install(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A distribution in ``site`` as an installer leaves it: its files, METADATA and RECORD."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for path, content in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(content)}")
    (info / "RECORD").write_text("".join(f"{row}\n" for row in rows))


def _site(tmp_path: Path) -> list[Any]:
    return list(importlib.metadata.distributions(path=[str(tmp_path)]))


BINDINGS_13 = {"cuda/bindings/__init__.py": b"__version__ = '13.5.0'\n"}
MONOLITHIC_12_6 = {"cuda/bindings/__init__.py": b"__version__ = '12.6.2.post1'\n",
                   "cuda/cudart.py": b""}


def test_cuda_python_of_old_installed_over_cuda_bindings_shadows_it(tmp_path: Path) -> None:
    install(tmp_path, "cuda-bindings", "13.5.0", BINDINGS_13)
    install(tmp_path, "cuda-python", "12.6.2.post1", MONOLITHIC_12_6)  # written last
    found = shadowed_cuda_bindings(_site(tmp_path))
    assert found is not None and (found.bindings, found.python) == ("13.5.0", "12.6.2.post1")
    assert found.message.endswith("pip install --force-reinstall --no-deps "
                                  "cuda-bindings==13.5.0")


def test_cuda_bindings_written_last_is_not_shadowed(tmp_path: Path) -> None:
    install(tmp_path, "cuda-python", "12.6.2.post1", MONOLITHIC_12_6)
    install(tmp_path, "cuda-bindings", "13.5.0", BINDINGS_13)  # what the fix does
    assert shadowed_cuda_bindings(_site(tmp_path)) is None


def test_cuda_python_as_a_metapackage_writes_no_bindings(tmp_path: Path) -> None:
    install(tmp_path, "cuda-bindings", "13.5.0", BINDINGS_13)
    install(tmp_path, "cuda-python", "13.4.4", {})
    assert shadowed_cuda_bindings(_site(tmp_path)) is None
