from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import speccompat
from speccompat.inprocess.adapters.attn_mask_utils_removed import (
    ID as MASK_ID,  # transformers 5.24.x
)
from speccompat.inprocess.adapters.config_dtype_annotation import ADAPTER, ID
from speccompat.patching import patched_by
from speccompat.targets import module_source
from support import (
    adapter_applies,
    import_fixes,
    only,
    requires_speculators,
    requires_vllm,
    run_python,
    speculators_generator,
)

pytestmark = [requires_vllm, requires_speculators]

# Each import runs in a fresh Python: `import speculators` happens once per process,
# and this pytest process may already have done it.
IMPORT = """
import json, sys
import speccompat

mode = sys.argv[1]
if mode == "raw":  # transformers 5.24.x also lacks a module; that has its own adapter
    speccompat.apply(only=["transformers.attn_mask_utils_removed"], strict=False)
elif mode == "apply":
    speccompat.apply()
elif mode == "exclude":
    speccompat.apply(exclude=[sys.argv[2]])
elif mode == "plugin":  # a vLLM worker: the entry point, then the worker extension
    from vllm.plugins import load_general_plugins
    load_general_plugins()
try:
    if mode == "plugin":
        import speculators.data_generation.custom_worker
    else:
        import speculators
except Exception as exc:
    message = str(exc).splitlines()[0]
    print(json.dumps({"error": [type(exc).__module__, type(exc).__name__, message]}))
    raise SystemExit(0)
out = {"error": None, "active": list(speccompat.active())}
if mode == "apply":
    import typing

    import pydantic
    import torch
    from speculators import SpeculatorModelConfig, SpeculatorsConfig, VerifierConfig
    from speculators.data_generation.custom_worker import HiddenStatesWorkerExtension
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    dtype = SpeculatorModelConfig.__pydantic_fields__["dtype"].annotation
    out["dtype_args"] = [getattr(a, "__name__", repr(a)) for a in typing.get_args(dtype)]
    out["dtype_is_torch"] = torch.dtype in typing.get_args(dtype)
    out["complete"] = SpeculatorModelConfig.__pydantic_complete__
    try:
        SpeculatorModelConfig.model_validate({"speculators_model_type": "nope"})
    except pydantic.ValidationError as exc:
        out["tags"] = exc.errors()[0]["ctx"]["expected_tags"]
    config = SpeculatorsConfig(
        algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
        default_proposal_method="greedy",
        verifier=VerifierConfig(name_or_path="tiny", architectures=["LlamaForCausalLM"]))
    back = SpeculatorsConfig.model_validate_json(config.model_dump_json())
    out["round_trip"] = back == config
    out["proposal"] = type(back.proposal_methods[0]).__name__
    out["generator"] = [VllmHiddenStatesGenerator.__name__, HiddenStatesWorkerExtension.__name__]
print(json.dumps(out))
"""


def _import(mode: str, **env: str) -> dict[str, Any]:
    # Not what this process applied: only what the mode (and ``env``) says.
    run = run_python("-c", textwrap.dedent(IMPORT), mode, ID, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def transformers5() -> None:
    if not adapter_applies(ID)[0]:
        pytest.skip(f"{speccompat.detect().describe()}: speculators imports as it is")
    problem = ADAPTER.probe()
    if problem is not None:
        pytest.fail(f"the adapter is for these versions, but its probe found: {problem}")


def _undefined_torch(result: dict[str, Any]) -> None:
    assert result["error"] == ["pydantic.errors", "PydanticUndefinedAnnotation",
                               "name 'torch' is not defined"], result


@pytest.mark.usefixtures("transformers5")
def test_raw_import_fails_on_transformers_5() -> None:
    _undefined_torch(_import("raw"))


@pytest.mark.usefixtures("transformers5")
def test_import_works_and_configs_validate() -> None:
    result = _import("apply")
    assert result["error"] is None, result
    assert ID in result["active"]
    assert result["dtype_args"] == ["str", "dtype", "NoneType"]
    assert result["dtype_is_torch"] is True  # resolved to the real torch.dtype, not Any
    assert result["complete"] is True
    assert result["tags"] == "'eagle', 'eagle3', 'independent', 'mlp'"
    assert result["round_trip"] is True
    assert result["proposal"] == "GreedyTokenProposalConfig"
    assert result["generator"] == ["VllmHiddenStatesGenerator", "HiddenStatesWorkerExtension"]


@pytest.mark.usefixtures("transformers5")
def test_import_fails_without_it() -> None:
    _undefined_torch(_import("exclude"))


@pytest.mark.usefixtures("transformers5")
def test_vllm_workers_get_it_before_the_worker_extension() -> None:
    # vLLM's worker loads the general plugins, then imports the extension class; the
    # parent hands down every adapter speculators needs to import here (on vLLM 0.33.0
    # the moved KV-cache helpers too).
    result = _import("plugin", SPECCOMPAT_ACTIVE=json.dumps(sorted({ID, MASK_ID,
                                                                    *import_fixes()})))
    assert result["error"] is None and ID in result["active"], result


@pytest.mark.usefixtures("transformers5")
def test_revert_restores_reload_schema() -> None:
    # Under transformers 5.24.x speculators imports only with the stand-in as well.
    stand_in = [MASK_ID] if module_source("transformers.modeling_attn_mask_utils") is None else []
    with only(ID, *stand_in):
        from speculators.utils import pydantic_utils

        owner = pydantic_utils.ReloadableBaseModel
        assert patched_by(vars(owner)["reload_schema"]) == ID
    restored = vars(owner)["reload_schema"]
    assert isinstance(restored, classmethod) and patched_by(restored) is None
    assert restored.__func__.__qualname__ == "ReloadableBaseModel.reload_schema"
    assert restored.__func__.__module__ == pydantic_utils.__name__


@pytest.mark.usefixtures("transformers5")
def test_extraction_runs_under_transformers_5(tiny_llama: Path) -> None:
    """Importing is not the goal: the generator extracts, whichever vLLM (0.19.1-0.23.x
    take transformers 5 as readily as 0.24+ require it)."""
    import torch

    import tiny_models

    hidden = json.loads((tiny_llama / "config.json").read_text())["hidden_size"]
    with speculators_generator(tiny_llama, layer_ids=[1, 2]) as gen:
        out = gen.generate(tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [12, 5]))
    assert [len(r["hidden_states"]) for r in out] == [2, 2]
    assert [tuple(s.shape) for r in out for s in r["hidden_states"]] == [
        (12, hidden), (12, hidden), (5, hidden), (5, hidden)]
    assert all(torch.isfinite(s).all() for r in out for s in r["hidden_states"])


def test_selected_by_the_installed_transformers() -> None:
    """doctor in a fresh process: both transformers-5 adapters follow the installed
    transformers, whatever vLLM it is paired with, and the line names it."""
    from packaging.version import Version

    run = run_python("-m", "speccompat", "doctor", "--json", timeout=300)
    states = {a["id"]: a for a in json.loads(run.stdout)["adapters"]}
    env = speccompat.detect()
    assert env.transformers is not None
    installed = env.transformers.version
    for adapter_id, first, last in ((ID, "5.4.0", None), (MASK_ID, "5.24.0", "5.25.0")):
        line = states[adapter_id]
        wanted = installed >= Version(first) and (last is None or installed < Version(last))
        expected = "applied" if wanted else "not needed"
        assert line["state"] == expected, line
        assert line["reason"].startswith(f"transformers {installed} is "), line


def test_not_needed_on_transformers_4() -> None:
    if adapter_applies(ID)[0]:
        pytest.skip(f"{speccompat.detect().transformers} has the annotation")
    report = speccompat.apply(only=[ID])
    try:
        assert report.state_of(ID) is speccompat.State.NOT_NEEDED
    finally:
        speccompat.revert()
    assert _import("raw") == {"error": None, "active": []}
