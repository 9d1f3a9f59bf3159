"""From vLLM 0.29.0 the CPU build's attention kernels take KV-cache blocks in multiples
of 32 tokens (``CPUAttentionBackend.get_supported_kernel_block_sizes``: ``MultipleOf(32)``,
16 before). speculators 0.3.0 and 0.4.0 fix ``VLLM_BLOCK_SIZE = 16`` for the cache
config (and 0.4.0 for its scheduler), so the CPU worker fails at start: "No common
block size for 16 (CPU_ATTN: [MultipleOf(32)])".

On the CPU platform the generator's block size becomes the smallest size the backend
accepts; its other users (scheduler, block hasher) read the same constant or the cache
config, so they stay consistent. CUDA backends accept 16, and nothing changes there.
"""

from __future__ import annotations

import re
from types import ModuleType

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, module_source, require_in_source
from ...versions import spec

ID = "vllm.cpu_attention_block_size"
CPU_ATTENTION = "vllm.v1.attention.backends.cpu_attn"
_MULTIPLE = re.compile(r"return \[MultipleOf\((\d+)\)\]")


def cpu_block_multiple() -> int | None:
    """The multiple the CPU attention backend requires, read from its source."""
    found = _MULTIPLE.search(module_source(CPU_ATTENTION) or "")
    return int(found.group(1)) if found else None


def _probe() -> str | None:
    multiple = cpu_block_multiple()
    if multiple is None:
        return f"{CPU_ATTENTION} has no single MultipleOf(N) block-size rule"
    if 16 % multiple == 0:
        return f"the CPU attention backend accepts multiples of {multiple}, so 16 works"
    return require_in_source(GENERATOR, "VLLM_BLOCK_SIZE =", "block_size=VLLM_BLOCK_SIZE")


def _patch(patcher: Patcher) -> None:
    def on_generator(module: ModuleType) -> None:
        from vllm.platforms import current_platform

        multiple = cpu_block_multiple()
        if not current_platform.is_cpu() or multiple is None:
            return
        size = int(module.VLLM_BLOCK_SIZE)
        if size % multiple:
            patcher.replace(module, "VLLM_BLOCK_SIZE", -(-size // multiple) * multiple)

    patcher.on_import(GENERATOR, on_generator)


ADAPTER = Adapter(
    id=ID,
    summary="on vLLM's CPU build the generator's KV-cache block size is a multiple the CPU "
    "attention kernels accept",
    why="the CPU worker fails at start: \"No common block size for 16 (CPU_ATTN: "
    "[MultipleOf(32)])\"",
    how="on the CPU platform, rounds the generator's VLLM_BLOCK_SIZE up to the multiple the CPU "
    "attention backend requires",
    upstream="vLLM 0.29.0: CPU attention supports block sizes MultipleOf(32) (was 16)",
    upstream_ref="none found: CPUAttentionBackend.get_supported_kernel_block_sizes first returns "
    "MultipleOf(32) in the vLLM 0.29.0 wheel; no PR for it was located",
    vllm=spec(">=0.29.0"),
    speculators=spec(">=0.3,<0.5"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 and 0.4.0 are no longer supported",
)
