"""Tensor lists that cross a process boundary through a shared-memory file, not as bytes.

vLLM's multiproc message queue pickles replies. A CUDA tensor pickles by copying its
storage to host memory, serialising it, and rebuilding it on the same GPU in the
receiving process; a CPU tensor by serialising its bytes. For captured hidden states
(gigabytes per batch) that is most of the extraction time. ``SharedTensors`` holds its
tensors in one file under /dev/shm and pickles as that file's name: the receiver maps
the file, so the bytes are copied once, device to host, in the worker.

Workers and driver must share a host (vLLM's MultiprocExecutor). Set
``SPECCOMPAT_SHM_TRANSFER=0`` to send plain CPU tensors instead.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence
from typing import Any

SHM_DIR = "/dev/shm"
SWITCH_ENV = "SPECCOMPAT_SHM_TRANSFER"


ALIGN = 64  # every tensor starts on a cache line, so any dtype can view its bytes


class SharedTensors(list):  # type: ignore[type-arg]
    """A list of CPU tensors backed by one shared-memory file; pickles as the file's name.

    Handed to another process, the receiver maps and unlinks the file; kept in this
    process (an in-process executor), the file is unlinked when the list is collected.
    """

    def __init__(self, tensors: Sequence[Any], path: str, layout: list[Any]) -> None:
        super().__init__(tensors)
        self.path = path
        self.layout = layout
        self.handed_over = False

    def __reduce__(self) -> tuple[Any, ...]:
        self.handed_over = True
        return (_attach, (self.path, self.layout))

    def __del__(self) -> None:
        if not self.handed_over:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def to_host(tensors: Sequence[Any]) -> list[Any]:
    """Copy ``tensors`` to host memory, in a shared-memory file when that is possible."""
    import torch

    layout = []
    total = 0
    for tensor in tensors:
        layout.append((str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), total))
        total += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    path = _new_file(total) if total and os.environ.get(SWITCH_ENV, "1") != "0" else None
    if path is None:
        return [t.to("cpu") for t in tensors]
    views = _views(torch.from_file(path, shared=True, size=total, dtype=torch.uint8), layout)
    for view, tensor in zip(views, tensors, strict=True):
        view.copy_(tensor)
    return SharedTensors(views, path, layout)


def _views(storage: Any, layout: list[tuple[str, tuple[int, ...], int]]) -> list[Any]:
    import torch

    out = []
    for name, shape, offset in layout:
        dtype = getattr(torch, name)
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        out.append(storage[offset:offset + size].view(dtype).view(shape))
    return out


def _new_file(size: int) -> str | None:
    """A fresh file name under /dev/shm with room for ``size`` bytes, or None."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < 2 * size:
        return None  # a small /dev/shm (containers default to 64 MiB): send bytes instead
    return os.path.join(SHM_DIR, f"speccompat-{os.getpid()}-{uuid.uuid4().hex}")


def _attach(path: str, layout: list[tuple[str, tuple[int, ...], int]]) -> list[Any]:
    import torch

    size = os.path.getsize(path)
    views = _views(torch.from_file(path, shared=True, size=size, dtype=torch.uint8), layout)
    os.unlink(path)  # the mapping keeps the memory alive; nothing is left in /dev/shm
    return views
