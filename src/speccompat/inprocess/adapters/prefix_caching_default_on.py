"""vLLM V1 turns prefix caching on by default; extraction must compute every token.

A prefix-cache hit skips the forward for the cached tokens, so their hidden
states are never captured; and requests built by hand carry no block hasher,
so vLLM 0.16 asserts in ``cache_full_blocks``. The generator's ``CacheConfig``
is built with prefix caching off unless the caller chose otherwise
(speculators 0.4.0 does the same).
"""

from __future__ import annotations

import re

from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import GENERATOR, module_source
from ...versions import spec
from ...wrappers import with_defaults

ID = "vllm.prefix_caching_default_on"


_DEFAULT = re.compile(r"^    enable_prefix_caching: [^=\n]+= (\w+)", re.MULTILINE)


def _probe() -> str | None:
    # Read, not imported: importing vllm.config costs seconds in apply().
    default = _DEFAULT.search(module_source("vllm.config.cache") or "")
    if default is None:
        return "CacheConfig declares no enable_prefix_caching default"
    if default.group(1) in ("False", "None"):  # None (0.11.x): a hand-built config stays off
        return "CacheConfig() has prefix caching off by default"
    return None


def _patch(patcher: Patcher) -> None:
    patcher.wrap_on_import(GENERATOR, "CacheConfig",
                           lambda original: with_defaults(original, enable_prefix_caching=False))


ADAPTER = Adapter(
    id=ID,
    summary="the generator's CacheConfig has prefix caching off, so every token is computed",
    why="a prefix-cache hit skips the forward for the cached tokens, so their hidden states are "
    "never captured; and hand-built requests without a block hasher assert in cache_full_blocks",
    how="wraps the generator's CacheConfig so enable_prefix_caching defaults to False",
    upstream="vLLM V1 engine: CacheConfig.enable_prefix_caching defaults to True (0.12.0; "
    "None in 0.11.0-0.11.2, where a hand-built config stays off); requests need "
    "Request(block_hasher=...) when it is on",
    upstream_ref="none found: CacheConfig.enable_prefix_caching first defaults to True in the "
    "vLLM 0.12.0 wheel; no PR for it was located",
    vllm=spec(">=0.12.0"),
    speculators=spec("==0.3.*"),
    side=Side.DRIVER,
    probe=_probe,
    patch=_patch,
    remove_when="speculators 0.3.0 is no longer supported (0.4.0 disables prefix caching)",
)
