"""The adapter record: what one adapter is, and which installed versions it is for.

This module imports nothing from the registry or the adapters: every adapter module
imports its record type from here, and the registry imports the adapters.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet

from .patching import Patcher
from .versions import Environment, vllm_platform

# The prefix of an ``upstream_ref`` that names no PR, commit or release note; a reason follows.
NONE_FOUND = "none found: "


class ExtractionPath(str, enum.Enum):
    """Which extraction system an adapter serves; each is applied its own way."""

    # speculators 0.3/0.4's VllmHiddenStatesGenerator: the user calls ``apply()``.
    IN_PROCESS = "in-process"
    # speculators >= 0.5 through ``vllm serve`` with ``extract_hidden_states``: the plugin
    # applies these inside the server's processes (``speccompat.server``).
    SERVER = "server"


class Side(str, enum.Enum):
    """Which vLLM process an adapter patches."""

    DRIVER = "driver"  # the process that drives the executor (speculators' generator)
    WORKER = "worker"  # vLLM's worker processes (model forward, worker extensions)
    BOTH = "both"


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One upstream behaviour that speccompat normalizes.

    The catalogue entry: ``summary`` (what it normalizes), ``why`` (what goes wrong
    without it), ``how`` (one line: what the patch does), ``upstream`` (the upstream
    change, with the release it first appears in), ``upstream_ref`` (the PR, commit or
    release note that made it, or ``"none found: <reason>"``), the specifiers, ``side``
    and ``remove_when``.

    ``probe`` inspects the installed upstream code without changing it and
    returns ``None`` when it has the shape this adapter expects, or a sentence
    saying what it found instead. ``patch`` makes the change through the given
    ``Patcher``, which is what makes ``revert`` exact.

    Selection follows the cause: ``vllm`` is set for behaviours that came with a vLLM
    release, ``transformers`` for those that came with a transformers release (and then
    ``vllm`` stays ``None``: which vLLM a resolver pairs with that transformers is not the
    cause). ``speculators`` narrows either to the consumer it adapts; with neither set it is
    the cause itself (speculators' own code, on every vLLM it runs on). ``platform`` ("cpu")
    keeps a behaviour of one vLLM platform from being selected on the others.
    """

    id: str
    summary: str
    why: str
    how: str
    upstream: str
    upstream_ref: str
    speculators: SpecifierSet | None
    side: Side
    probe: Callable[[], str | None]
    patch: Callable[[Patcher], None]
    remove_when: str
    vllm: SpecifierSet | None = None
    # For behaviours that come with a transformers release rather than a vLLM one.
    transformers: SpecifierSet | None = None
    # The vLLM platform the behaviour exists on ("cpu"), or None for every platform.
    platform: str | None = None

    def __post_init__(self) -> None:
        causes = [s for s in (self.vllm, self.transformers) if s is not None]
        if len(causes) > 1 or (not causes and self.speculators is None):
            raise ValueError(f"adapter {self.id}: select by exactly one causing package "
                             "(vllm=, transformers=, or speculators= alone)")

    @property
    def cause(self) -> str:
        """The package whose release brought the behaviour: the one that selects it."""
        if self.vllm is not None:
            return "vLLM"
        return "transformers" if self.transformers is not None else "speculators"

    @property
    def cause_specifier(self) -> SpecifierSet:
        for selector in (self.vllm, self.transformers, self.speculators):
            if selector is not None:  # __post_init__ guarantees one
                return selector
        raise AssertionError(f"adapter {self.id} has no causing package")

    def wants(self, env: Environment) -> tuple[bool, str]:
        """Whether the installed versions are ones this adapter is for, and why (not): the
        reason names the deciding package and its installed version."""
        if env.vllm is None:
            return False, "vLLM is not installed"
        if self.vllm is not None and env.vllm.version not in self.vllm:
            return False, f"vLLM {env.vllm.version} is outside {self.vllm}"
        if self.transformers is not None:
            if env.transformers is None:
                return False, "transformers is not installed"
            if env.transformers.version not in self.transformers:
                return False, (f"transformers {env.transformers.version} is outside "
                               f"{self.transformers}")
        if self.speculators is not None:
            if env.speculators is None:
                return False, "speculators is not installed"
            if env.speculators.version not in self.speculators:
                return False, f"speculators {env.speculators.version} is outside {self.speculators}"
        if self.transformers is not None:
            assert env.transformers is not None
            return True, f"transformers {env.transformers.version} is in {self.transformers}"
        if self.vllm is None:
            assert env.speculators is not None and self.speculators is not None
            return True, f"speculators {env.speculators.version} is in {self.speculators}"
        return True, f"vLLM {env.vllm.version} is in {self.vllm}"

    def off_platform(self, env: Environment) -> str | None:
        """Why the running platform is not the one the behaviour exists on, or ``None`` (no
        platform bound, the right one, or one that cannot be told: the hook checks again)."""
        if self.platform is None:
            return None
        running = env.platform or vllm_platform()
        if running is None or running == self.platform:
            return None
        return (f"vLLM's platform here is {running}; the behaviour exists only on the "
                f"{self.platform} platform")

    def as_dict(self) -> dict[str, str | None]:
        """Every field of the record but the callables, specifiers as strings."""
        return {
            "id": self.id,
            "summary": self.summary,
            "why": self.why,
            "how": self.how,
            "upstream": self.upstream,
            "upstream_ref": self.upstream_ref,
            "cause": self.cause,
            "vllm": None if self.vllm is None else str(self.vllm),
            "transformers": None if self.transformers is None else str(self.transformers),
            "speculators": None if self.speculators is None else str(self.speculators),
            "side": self.side.value,
            "platform": self.platform,
            "remove_when": self.remove_when,
        }
