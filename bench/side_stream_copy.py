"""Host and GPU cost of one step's device-to-host copies (32 requests x 4 layers of 256
rows x 4096 bf16) on a side CUDA stream, into a page-locked /dev/shm slot
(``shm.reserve``) and into torch's pinned memory, while a forward-like load (matmuls) runs
on the main stream; and the load followed by a blocking copy, as the copy after a batch's
last step does. Needs one CUDA GPU: ``PYTHONPATH=src python3 bench/side_stream_copy.py``.
"""

from __future__ import annotations

import time

import torch

from speccompat.inprocess import shm

HIDDEN, ROWS, REQUESTS, LAYERS, STEPS = 4096, 8192, 32, 4, 20
PER_REQUEST = ROWS // REQUESTS


def main() -> None:
    device = torch.device("cuda")
    a = torch.randn(8192, 4096, device=device, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096 * 3, device=device, dtype=torch.bfloat16)
    values = [torch.randn(ROWS, HIDDEN, device=device, dtype=torch.bfloat16)
              for _ in range(LAYERS)]
    chunks = [(layer, r, values[layer][r * PER_REQUEST:(r + 1) * PER_REQUEST])
              for layer in range(LAYERS) for r in range(REQUESTS)]
    nbytes = LAYERS * ROWS * HIDDEN * 2
    reservation = shm.reserve(shm.HEADER + nbytes, for_cuda=True)
    assert reservation is not None, "no shared memory"
    slot = reservation.storage
    print("slot page-locked:", reservation.slot.pinned_at is not None, slot.is_pinned())
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()

    def targets(store: torch.Tensor, offset: int) -> list[torch.Tensor]:
        out = []
        for layer, r, _ in chunks:
            start = offset + (layer * ROWS + r * PER_REQUEST) * HIDDEN * 2
            view = store[start:start + PER_REQUEST * HIDDEN * 2]
            out.append(view.view(torch.bfloat16).view(PER_REQUEST, HIDDEN))
        return out

    def load() -> None:
        for _ in range(20):
            torch.matmul(a, w)

    def run(kind: str, store: torch.Tensor | None = None, offset: int = 0) -> None:
        torch.cuda.synchronize()
        dest = targets(store, offset) if store is not None else None
        launches = 0.0
        start = time.perf_counter()
        for _ in range(STEPS):
            before = torch.cuda.current_stream().record_event()
            load()
            if dest is not None:
                t0 = time.perf_counter()
                side.wait_event(before)
                with torch.cuda.stream(side):
                    for target, (_, _, chunk) in zip(dest, chunks, strict=True):
                        target.copy_(chunk, non_blocking=True)
                launches += time.perf_counter() - t0
            torch.cuda.current_stream().synchronize()
        side.synchronize()
        total = time.perf_counter() - start
        print(f"{kind:<28} total {total:.3f} s  copy launches (host) {launches:.3f} s"
              f"  over {STEPS} steps")

    run("warm-up")
    run("load only")
    run("registered shm slot", slot, shm.HEADER)
    run("torch pinned", pinned)
    run("load only")
    run("registered shm slot", slot, shm.HEADER)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        load()
        for target, (_, _, chunk) in zip(targets(slot, shm.HEADER), chunks, strict=True):
            target.copy_(chunk)
    torch.cuda.synchronize()
    print(f"{'load + blocking copy after':<28} total {time.perf_counter() - start:.3f} s")
    reservation.release()


if __name__ == "__main__":
    main()
