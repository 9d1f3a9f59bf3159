"""vLLM's ``ExampleHiddenStatesConnector`` writes whatever it reads from the hidden-states
cache. Where it reads slots nobody wrote (vLLM 0.24 on hybrid verifiers, speccompat's
``vllm.hidden_states_connector_group_block_size``; PR #46301 upstream), the file holds
rows of exact zeros and looks complete: a draft trained on it validates well and accepts
1-2% of tokens (speculators issue #613). No real token's hidden state is exactly zero
across a layer, so such a row is never data.

Before the connector writes a file, a row of exact zeros (every value ``== 0``) in any
layer slot refuses the write with :class:`ZeroHiddenStatesError`, naming speccompat, the
vLLM version and the likely cause, and leaves no file at that path:

- vLLM >= 0.22.0 writes from a thread pool (``_write_tensors`` calls the module's
  ``save_file``): the error is raised there; vLLM logs it ("Hidden-states write failed for
  req_id=...") and releases the ``.lock``, so a client waiting on the lock wakes up to no
  file. The engine keeps serving.
- vLLM 0.17.0-0.21.0 write inside the model's forward (``save_kv_layer`` calls
  ``safetensors.torch.save_file``), where an exception would kill the engine: the error is
  logged and the write skipped instead.

The check looks at each row's first values and scans a whole row only where those are
all zero: ``bench/zero_guard.py`` has its cost next to the write's. On CPU tensors (what
vLLM's writer threads hold) it reads the values' bits through NumPy, in the calling thread:
torch's own ops enter its intra-op thread pool, whose second thread waits for a free core
(on a loaded 2-core machine, 1000 x 4 x 4096 bf16: 0.15 ms in NumPy, 0.5 ms in torch on one
thread, 0.3-16 ms on two; 2026-12-06).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ...errors import SpeccompatError
from ...patching import Patcher
from ...record import Adapter, Side
from ...targets import CONNECTOR_FORWARD_WRITE, HIDDEN_STATES_CONNECTOR, module_source
from ...versions import spec
from ...wrappers import Proxy

ID = "vllm.hidden_states_connector_zero_rows"
CONNECTOR = HIDDEN_STATES_CONNECTOR
# How each release's connector writes a file.
THREAD_WRITE = "save_file(tensors, filename)"  # 0.22.0+: _write_tensors, module-level name
FORWARD_WRITE = CONNECTOR_FORWARD_WRITE  # 0.17.0-0.21.0
ISSUE = "speccompat issue #20; vLLM PR #46301 (https://github.com/vllm-project/vllm/pull/46301)"
# Values per row looked at before a whole row is scanned.
_PREFIX = 16

log = logging.getLogger("vllm.speccompat")


class ZeroHiddenStatesError(SpeccompatError, ValueError):
    """A hidden-states file would hold rows of exact zeros: states nobody wrote."""

    def __init__(self, filename: str, tokens: int, per_layer: Mapping[int, int],
                 vllm_version: str) -> None:
        self.filename = filename
        self.tokens = tokens
        self.per_layer = dict(per_layer)
        found = "; ".join(f"layer slot {i}: {n} of {tokens} rows"
                          for i, n in self.per_layer.items())
        super().__init__(
            f"speccompat refused to write {filename}: rows of exact zeros ({found}). No real "
            f"token's hidden state is all zeros: these are cache slots the connector read but "
            f"nobody wrote (vLLM {vllm_version}). Likely cause: the connector reading the "
            f"hidden-states cache with the wrong block size on a hybrid (linear + full "
            f"attention) verifier ({ISSUE}); run `python -m speccompat doctor` and check "
            f"that vllm.hidden_states_connector_group_block_size applies. Nothing was "
            f"written for this request.")


def zero_rows(states: Any) -> dict[int, int]:
    """Rows of exact zeros per layer slot of ``hidden_states`` ``[tokens, layers, hidden]``
    ({} when there are none, or for a tensor of another shape or dtype)."""
    if getattr(states, "dim", None) is None or states.dim() != 3:
        return {}
    if not states.is_floating_point() or states.numel() == 0:
        return {}
    bits = _magnitude_bits(states)
    if bits is not None:
        return _zero_rows_in_bits(*bits)
    return _zero_rows_in_torch(states)


def _zero_rows_in_torch(states: Any) -> dict[int, int]:
    """``zero_rows`` in torch's own ops, on any device."""
    # A real row has non-zero values from its first ones on: only rows whose prefix is all
    # zero are read in full.
    suspects = (states[..., :_PREFIX] == 0).all(dim=2)
    if not bool(suspects.any()):
        return {}
    zero = suspects.clone()
    zero[suspects] = (states[suspects] == 0).all(dim=1)
    counts = zero.sum(dim=0).tolist()
    return {i: int(n) for i, n in enumerate(counts) if n}


def _magnitude_bits(states: Any) -> tuple[Any, int] | None:
    """A CPU tensor's values as a NumPy integer array over the same memory, and the mask that
    clears the sign bit (a value is +0 or -0 where nothing else is set); None where that view
    is not to be had (another device, no NumPy, no integer type of that width)."""
    import torch

    if states.device.type != "cpu":
        return None
    twin = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(
        states.element_size())
    if twin is None:
        return None
    try:
        array = states.detach().view(twin).numpy()
    except (RuntimeError, TypeError):  # no NumPy beside this torch
        return None
    return array, (1 << (8 * states.element_size() - 1)) - 1


def _zero_rows_in_bits(array: Any, magnitude: int) -> dict[int, int]:
    """``zero_rows`` on the integer view of ``_magnitude_bits``."""
    suspects = ~(array[..., :_PREFIX] & magnitude).any(axis=2)
    if not suspects.any():
        return {}
    zero = suspects.copy()
    zero[suspects] = ~(array[suspects] & magnitude).any(axis=1)
    counts = zero.sum(axis=0).tolist()
    return {i: int(n) for i, n in enumerate(counts) if n}


def check(tensors: Mapping[str, Any], filename: str) -> None:
    """Raise :class:`ZeroHiddenStatesError` (after removing any file at ``filename``) if the
    ``hidden_states`` about to be written there have rows of exact zeros."""
    states = tensors.get("hidden_states")
    if states is None:
        return
    found = zero_rows(states)
    if not found:
        return
    import vllm

    with contextlib.suppress(FileNotFoundError):
        os.remove(filename)  # a file left from before would look like this request's
    raise ZeroHiddenStatesError(str(filename), int(states.shape[0]), found,
                                str(getattr(vllm, "__version__", "unknown")))


def _guard_raising(save_file: Callable[..., Any]) -> Callable[..., Any]:
    """0.22.0+: in the writer thread, where vLLM catches and logs what the write raises."""

    @functools.wraps(save_file)
    def guarded_save_file(tensors: Mapping[str, Any], filename: str, *args: Any,
                          **kwargs: Any) -> Any:
        check(tensors, filename)
        return save_file(tensors, filename, *args, **kwargs)

    return guarded_save_file


def _guard_logging(save_file: Callable[..., Any]) -> Callable[..., Any]:
    """0.17.0-0.21.0: inside the model's forward, where raising would kill the engine."""

    @functools.wraps(save_file)
    def guarded_save_file(tensors: Mapping[str, Any], filename: str, *args: Any,
                          **kwargs: Any) -> Any:
        try:
            check(tensors, filename)
        except ZeroHiddenStatesError as error:
            log.error("%s", error)
            return None
        return save_file(tensors, filename, *args, **kwargs)

    return guarded_save_file


class _SafetensorsTorch(Proxy):
    def __init__(self, inner: ModuleType) -> None:
        super().__init__(inner)
        object.__setattr__(self, "save_file", _guard_logging(inner.save_file))


class GuardedSafetensors(Proxy):
    """The 0.17.0-0.21.0 connector module's ``safetensors``: ``.torch.save_file`` guarded."""

    def __init__(self, safetensors: ModuleType) -> None:
        super().__init__(safetensors)
        st = importlib.import_module("safetensors.torch")
        object.__setattr__(self, "torch", _SafetensorsTorch(st))


def _probe() -> str | None:
    source = module_source(CONNECTOR)
    if source is None:
        return f"{CONNECTOR} is not installed"
    if THREAD_WRITE not in source and FORWARD_WRITE not in source:
        return f"{CONNECTOR} writes with neither {THREAD_WRITE!r} nor {FORWARD_WRITE!r}"
    return None


def _guard_writes(patcher: Patcher, module: ModuleType) -> None:
    """The name the release's connector writes through: its own ``save_file`` (0.22.0+) or
    the ``safetensors`` module it reaches ``torch.save_file`` through (0.17.0-0.21.0)."""
    threaded = "save_file" in vars(module)
    name, guard = ("save_file", _guard_raising) if threaded else ("safetensors", GuardedSafetensors)
    patcher.wrap(module, name, guard)


def _patch(patcher: Patcher) -> None:
    patcher.on_import(CONNECTOR, functools.partial(_guard_writes, patcher))


ADAPTER = Adapter(
    id=ID,
    summary="ExampleHiddenStatesConnector refuses to write hidden-states files with rows of "
    "exact zeros",
    why="the connector writes whatever it reads from the cache: slots nobody wrote (vLLM 0.24 "
    "on hybrid verifiers) become all-zero rows in a file that looks complete, and a draft "
    "trained on it validates well and accepts 1-2% of tokens",
    how="wraps the connector module's save_file (0.22+: raises ZeroHiddenStatesError in the "
    "writer thread; 0.17-0.21: safetensors.torch.save_file, logs it and skips the write) "
    "and removes any file at that path",
    upstream="vLLM 0.17.0: ExampleHiddenStatesConnector saves the cache's rows unchecked; "
    "0.24.0 reads unwritten rows on hybrid verifiers",
    upstream_ref="none found: vLLM has no check on the rows it writes; the zero rows are "
    "vLLM PR #46301's bug (speculators issue #613)",
    vllm=spec(">=0.17.0"),
    side=Side.WORKER,
    speculators=None,
    probe=_probe,
    patch=_patch,
    remove_when="vLLM's connector refuses or reports rows nobody wrote",
)
