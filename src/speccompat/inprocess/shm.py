"""Tensor lists that cross a process boundary through a shared-memory file, not as bytes.

vLLM's multiproc message queue pickles replies. A CUDA tensor pickles by copying its
storage to host memory, serialising it, and rebuilding it on the same GPU in the
receiving process; a CPU tensor by serialising its bytes. For captured hidden states
(gigabytes per batch) that is most of the extraction time. ``SharedTensors`` holds its
tensors in a file under /dev/shm and pickles as that file's name: the receiver maps the
file, so the bytes are copied once, device to host, in the worker.

A fresh file per batch costs more than the copy: the kernel hands tmpfs memory out a
4 KiB page at a time (1.0 s per 1.4 GB batch on the H200 host, against 0.03 s for the
copy into pinned memory; docs/results/gpu-results.md). So each worker keeps its file (a
``_Slot``) across batches, pinned for CUDA copies, and reuses it once nobody maps it
any more. Three mark bytes at the start of the file say who may still read it; each is
written by one process only, so no lock is needed:

- ``HANDED``: set by the worker when it pickles the list, cleared by the reader after
  it mapped the file (the reader maps it before the worker can be asked for more);
- ``READER``: set by the reader's mapping, cleared when its last tensor is gone;
- ``LOCAL``: the same for the worker's own list (an in-process consumer).

A slot whose marks are not all clear is left alone and a new one is made: a consumer
that keeps the tensors gets fresh memory, never overwritten memory. So the reader's
tensors (a ``HandedOver`` list) need no copy, and ``own_storage`` gives a part of one a
storage of its own (speculators 0.3.0's per-sample slices). Only ``MAX_PINNED_SLOTS``
slots are page-locked: one whose reader keeps every batch gets a new, pageable slot per
batch rather than ever more locked memory.

Workers and driver must share a host (vLLM's MultiprocExecutor). Set
``SPECCOMPAT_SHM_TRANSFER=0`` to send plain CPU tensors instead.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

SHM_DIR = "/dev/shm"
SWITCH_ENV = "SPECCOMPAT_SHM_TRANSFER"
PREFIX = "speccompat-"

ALIGN = 64  # every tensor starts on a cache line, so any dtype can view its bytes
HEADER = ALIGN  # the mark bytes, before the first tensor
HANDED, READER, LOCAL = 0, 1, 2
GROWTH = 1.25  # a slot grows with headroom: batch sizes vary from call to call
# A reader that drops batch N's tensors while batch N+1 is made needs two slots.
MAX_PINNED_SLOTS = 2

Layout = list[tuple[str, tuple[int, ...], int]]

_LOG = logging.getLogger("vllm.speccompat")
_unpinned_warned = False


class SharedTensors(list):  # type: ignore[type-arg]
    """A list of CPU tensors backed by a shared-memory file; pickles as the file's name."""

    def __init__(self, tensors: Sequence[Any], path: str, layout: Layout,
                 on_handover: Callable[[], None], persistent: bool) -> None:
        super().__init__(tensors)
        self.path = path
        self.layout = layout
        self.on_handover = on_handover
        self.persistent = persistent
        self.handed_over = False

    def __reduce__(self) -> tuple[Any, ...]:
        self.handed_over = True
        self.on_handover()
        return (_attach, (self.path, self.layout, self.persistent))

    def __del__(self) -> None:
        if not self.persistent and not self.handed_over:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class HandedOver(list):  # type: ignore[type-arg]
    """The reader's tensors of one hand-over: memory that no process writes again while any
    tensor maps it, so they need no defensive copy."""


def own_storage(tensor: Any) -> Any:
    """``tensor``'s bytes as a tensor with a storage of exactly those bytes, without a copy;
    it keeps the memory it maps alive. A plain slice would keep its whole storage, and
    ``torch.save`` would write all of it (one batch per sample); a tensor that is not
    contiguous, or empty, is copied."""
    import torch

    if tensor.numel() == 0 or not tensor.is_contiguous() or tensor.is_cuda:
        return tensor.clone().cpu()
    # numpy's array keeps the tensor (and so the mapping) alive; frombuffer keeps the array.
    raw = tensor.view(torch.uint8).reshape(-1).numpy()
    return torch.frombuffer(raw, dtype=torch.uint8).view(tensor.dtype).view(tensor.shape)


class _Mapping(mmap.mmap):
    """A mapping of a slot file that holds one mark byte set while it lives; tensors
    made with ``torch.frombuffer`` keep it alive, so it dies with the last of them."""

    mark: int | None = None

    def hold(self, mark: int) -> _Mapping:
        self[mark] = 1
        self.mark = mark
        return self

    def __del__(self) -> None:
        if self.mark is not None:
            with contextlib.suppress(ValueError):  # already closed
                self[self.mark] = 0


class _Slot:
    """One worker-owned file under /dev/shm, mapped for writing for the slot's life."""

    def __init__(self, path: str, size: int, may_pin: bool = True) -> None:
        self.path = path
        self.size = size
        self.may_pin = may_pin
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.pinned_at: int | None = None
        self.reserved = False  # taken by a ``Reservation`` whose list is not made yet

    def free(self) -> bool:
        return not self.reserved and self.mapping[:LOCAL + 1] == bytes(LOCAL + 1)

    def write(self, tensors: Sequence[Any], layout: Layout) -> None:
        import torch

        if any(t.is_cuda for t in tensors):
            self.pin()
        storage = torch.frombuffer(self.mapping, dtype=torch.uint8)
        for view, tensor in zip(_views(storage, layout), tensors, strict=True):
            view.copy_(tensor)

    def pin(self) -> None:
        """Page-lock the file's memory once, so CUDA copies into it at full speed (and
        asynchronously). Where the driver refuses, the copies stay pageable (correct, slower)."""
        import torch

        if self.pinned_at is not None:
            return
        if not self.may_pin:
            _warn_unpinned(self.size, f"{MAX_PINNED_SLOTS} other slots, still mapped by "
                           "their reader, hold the page locks")
            return

        address = torch.frombuffer(self.mapping, dtype=torch.uint8).data_ptr()
        try:
            status = int(torch.cuda.cudart().cudaHostRegister(address, self.size, 0))
        except (AttributeError, RuntimeError) as exc:  # a torch without the binding
            _warn_unpinned(self.size, f"{type(exc).__name__}: {exc}")
            return
        if status == 0:
            self.pinned_at = address
        else:
            _warn_unpinned(self.size, f"cudaHostRegister returned CUDA error {status}")

    def handed(self) -> None:
        self.mapping[HANDED] = 1

    def hand_over(self, layout: Layout) -> SharedTensors:
        """The slot's tensors as the list the driver gets (mapped again here, so this
        process's views hold the slot until dropped)."""
        views = _views(_map(self.path, self.size, LOCAL), layout)
        return SharedTensors(views, self.path, layout, self.handed, persistent=True)

    def close(self) -> None:
        if self.pinned_at is not None:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.pinned_at)
            self.pinned_at = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):  # a tensor of ours still maps it
            self.mapping.close()


class _Pool:
    """This process's slots."""

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        _remove_orphans()
        atexit.register(self.close)

    def slot_for(self, size: int) -> _Slot | None:
        free = [s for s in self.slots if s.free()]
        fitting = [s for s in free if s.size >= size]
        if fitting:
            return min(fitting, key=lambda s: s.size)
        # None fits: every free slot is too small. Closing them gives their memory and their
        # page lock to the new one. Kept, a small first batch's pinned slot left the next
        # one pageable: 8 of bench/gpu_extract.py's 16 batches after it copied at a fifth
        # of the speed (a simulation of its slot choices, docs/results/gpu-results.md).
        for slot in free:
            self.slots.remove(slot)
            slot.close()
        size = -(-int(size * GROWTH) // mmap.PAGESIZE) * mmap.PAGESIZE
        path = _new_file(size)
        if path is None:
            return None
        pinned = sum(s.may_pin for s in self.slots)
        slot = _Slot(path, size, may_pin=pinned < MAX_PINNED_SLOTS)
        self.slots.append(slot)
        return slot

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots.clear()


_POOL: _Pool | None = None


def _pool() -> _Pool:
    global _POOL
    if _POOL is None:
        _POOL = _Pool()
    return _POOL


def _warn_unpinned(size: int, why: str) -> None:
    """Once per process: a slow path must say so (a streamed copy into pageable memory
    blocks the worker until it is done instead of running beside the next forward)."""
    global _unpinned_warned
    if _unpinned_warned:
        return
    _unpinned_warned = True
    _LOG.warning(
        "speccompat: could not page-lock a %.2f GiB shared-memory slot for the captured "
        "hidden states (%s); copies to the host stay pageable: correct, but they no longer "
        "overlap the forward, so extraction is slower", size / 2**30, why)


class Reservation:
    """A reusable slot taken before its tensors exist, so the capture can write each step's
    rows into their final place (on CUDA, while the next step runs) instead of copying the
    whole batch afterwards. ``hand_over`` makes the list, as ``to_host`` would have;
    ``release`` gives the slot back unused."""

    def __init__(self, slot: _Slot, for_cuda: bool) -> None:
        import torch

        self.slot = slot
        slot.reserved = True
        if for_cuda:
            slot.pin()
        self.storage = torch.frombuffer(slot.mapping, dtype=torch.uint8)

    def hand_over(self, layout: Layout) -> SharedTensors:
        self.slot.reserved = False
        return self.slot.hand_over(layout)

    def release(self) -> None:
        self.slot.reserved = False


def reserve(size: int, *, for_cuda: bool) -> Reservation | None:
    """A slot of at least ``size`` bytes (``HEADER`` included) for ``Reservation``'s
    in-place writes, or None where shared memory is off or too small."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return None
    slot = _pool().slot_for(size)
    return None if slot is None else Reservation(slot, for_cuda)


def to_host(tensors: Sequence[Any], *, reuse: bool = True) -> list[Any]:
    """Copy ``tensors`` to host memory, in shared memory when that is possible.

    ``reuse``: into this process's reusable slot (one list per call, as speculators 0.3.0
    fetches a batch); otherwise into a fresh file, unlinked by its reader.
    """
    import torch

    layout, total = _layout(tensors)
    if not total or os.environ.get(SWITCH_ENV, "1") == "0":
        return [t.to("cpu") for t in tensors]
    if reuse:
        slot = _pool().slot_for(total)
        if slot is None:
            return [t.to("cpu") for t in tensors]
        slot.write(tensors, layout)
        return slot.hand_over(layout)
    path = _new_file(total)
    if path is None:
        return [t.to("cpu") for t in tensors]
    views = _views(torch.from_file(path, shared=True, size=total, dtype=torch.uint8), layout)
    for view, tensor in zip(views, tensors, strict=True):
        view.copy_(tensor)
    return SharedTensors(views, path, layout, lambda: None, persistent=False)


def _layout(tensors: Sequence[Any]) -> tuple[Layout, int]:
    layout: Layout = []
    offset = HEADER
    for tensor in tensors:
        layout.append((str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return layout, (offset if tensors else 0)


def _views(storage: Any, layout: Layout) -> list[Any]:
    import torch

    out = []
    for name, shape, offset in layout:
        dtype = getattr(torch, name)
        size = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        out.append(storage[offset:offset + size].view(dtype).view(shape))
    return out


def _map(path: str, size: int, mark: int) -> Any:
    """``path`` as a uint8 tensor whose mapping holds ``mark`` while any view of it lives."""
    import torch

    fd = os.open(path, os.O_RDWR)
    try:
        mapping = _Mapping(fd, size).hold(mark)
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=torch.uint8)


def _new_file(size: int) -> str | None:
    """A fresh file name under /dev/shm with room for ``size`` bytes, or None."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < 2 * size:
        return None  # a small /dev/shm (containers default to 64 MiB): send bytes instead
    return os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}")


def _remove_orphans() -> None:
    """Slots of workers that died without cleaning up (SIGKILL): their names only; a
    reader that still maps one keeps its memory."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if not name.startswith(PREFIX):
                continue
            pid = name.removeprefix(PREFIX).split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                path = os.path.join(SHM_DIR, name)
                if os.stat(path).st_uid == os.getuid():
                    os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _attach(path: str, layout: Layout, persistent: bool) -> list[Any]:
    """The reader's side: map the file, then let the worker know it is held here."""
    import torch

    size = os.path.getsize(path)
    if not persistent:
        views = _views(torch.from_file(path, shared=True, size=size, dtype=torch.uint8), layout)
        os.unlink(path)  # the mapping keeps the memory alive; nothing is left in /dev/shm
        return HandedOver(views)
    storage = _map(path, size, READER)
    storage[HANDED] = 0  # READER is set: the slot stays busy until these views are gone
    return HandedOver(_views(storage, layout))
