"""vLLM's ``KimiLinearModel`` (``vllm/models/kimi_k3/nvidia/model.py``, 0.27.0 onwards)
appends id 0 as the embeddings tensor itself; without attention residuals the first
``KimiDecoderLayer._pre_attn_norm`` makes that tensor its residual and ``_post_attn_norm``'s
fused add-RMSNorm adds into it in place (H200, vLLM 0.34.0, eager: id 0 off by max |diff|
4.18-4.44). The adapter gives ``_pre_attn_norm`` a copy where the residual is ``None`` and
the layer has no attention residuals; the layer-id check then serves id 0 on this stack.

The NVIDIA model module does not import on a machine without CUDA (its kernels pull the
CUTLASS DSL, which needs the CUDA runtime's bindings), and a ``KimiDecoderLayer`` cannot be
built here. So these tests run vLLM's own ``KimiDecoderLayer.forward``, ``_pre_attn_norm``
and ``_post_attn_norm``, compiled from the installed file, on a minimal layer whose
post-attention norm adds into the residual in place as the fused kernel does on CUDA
(``torch.ops._C.fused_add_rms_norm``; where the cell runs models, vLLM's own
``vllm._custom_ops.fused_add_rms_norm`` too), under the module's own name so that the adapter
patches it as it patches the real class. The same sequence through a real server on CUDA is
tests/gpu/test_gpu_new_architectures.py (``test_serve_every_id[kimi_k3_no_attn_res-*]``,
eager and compiled)."""

from __future__ import annotations

import importlib
import pickle
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest

import speccompat
from speccompat import registry
from speccompat.layers import LayerIdError
from speccompat.patching import applied
from speccompat.record import ExtractionPath
from speccompat.registry import SKIP_ENV
from speccompat.server.adapters import extract_hidden_states_layer_ids as layer_ids
from speccompat.server.adapters.kimi_linear_first_layer_alias import (
    ALIASING_CAPTURE,
    FIRST_RESIDUAL,
    ID,
    LAYER,
    LAYER_FLAG,
    METHOD,
    MODEL,
    PARAMS,
    STACK,
    UPSTREAM,
    _pre_attn_norm,
    _probe,
)
from speccompat.targets import source_def
from support import contract_only_reason, needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM before 0.27.0 has no vllm/models/kimi_k3 (Kimi-Linear's "
                        "model_executor/models/kimi_linear.py captures no aux states)")
HIDDEN = 64
TOKENS = 9
EPS = 1e-6
KERNELS = ["torch", pytest.param("vllm_c", marks=pytest.mark.skipif(
    bool(contract_only_reason()), reason=contract_only_reason()))]


def _rms(x: Any) -> Any:
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class _Norm:
    """vLLM's RMSNorm as the layer calls it: ``norm(x)`` a new tensor; ``norm(x, residual)``
    the fused add-RMSNorm, in place in both tensors as on CUDA."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel

    def __call__(self, x: Any, residual: Any = None) -> Any:
        import torch

        if residual is None:
            return _rms(x)
        if self.kernel == "vllm_c":
            from vllm import _custom_ops as ops

            if torch.cuda.is_available():  # the CUDA wheel has the kernel for CUDA only
                on_gpu, residual_on_gpu = x.cuda(), residual.cuda()
                ops.fused_add_rms_norm(on_gpu, residual_on_gpu,
                                       torch.ones(HIDDEN, device="cuda"), EPS)
                x.copy_(on_gpu.cpu())  # in place, as the kernel is on the tensors it is given
                residual.copy_(residual_on_gpu.cpu())
            else:
                ops.fused_add_rms_norm(x, residual, torch.ones(HIDDEN), EPS)
        else:
            residual.add_(x)
            x.copy_(_rms(residual))
        return x, residual


def _vllm_method(qualname: str) -> Any:
    """vLLM's own method, compiled from the installed file."""
    import torch

    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(textwrap.dedent(source_text(MODEL, qualname)), f"<vLLM {qualname}>", "exec"),
         namespace)
    return namespace[qualname.rsplit(".", 1)[1]]


def _layer_class() -> type:
    """A ``KimiDecoderLayer`` with vLLM's forward and norm steps; attention and MoE/MLP are
    stand-ins that make new tensors (as vLLM's do)."""

    class KimiDecoderLayer:
        forward = _vllm_method(f"{LAYER}.forward")
        _pre_attn_norm = _vllm_method(f"{LAYER}._pre_attn_norm")
        _post_attn_norm = _vllm_method(f"{LAYER}._post_attn_norm")

        def __init__(self, kernel: str, use_attn_res: bool = False) -> None:
            self.use_attn_res = use_attn_res
            self.use_sequence_parallel = False
            self.input_layernorm = _Norm(kernel)
            self.post_attention_layernorm = _Norm(kernel)

        def _run_self_attn(self, positions: Any, hidden_states: Any) -> Any:
            return hidden_states * 0.5 + 1.0

        def mlp(self, hidden_states: Any) -> Any:
            return hidden_states * 2.0

    return KimiDecoderLayer


@pytest.fixture
def stand_in() -> Iterator[type]:
    """The layer class under the NVIDIA model module's name (not importable here), where the
    adapter's import hook finds it."""
    module = types.ModuleType(MODEL)
    layer = _layer_class()
    setattr(module, LAYER, layer)
    previous = sys.modules.get(MODEL)
    sys.modules[MODEL] = module
    try:
        yield layer
    finally:
        speccompat.revert()
        if previous is None:
            sys.modules.pop(MODEL, None)
        else:
            sys.modules[MODEL] = previous


def _apply(*ids: str) -> None:
    report = registry._apply(only=list(ids), paths=(ExtractionPath.SERVER,), judge_support=False)
    for adapter_id in ids:
        assert report.state_of(adapter_id) is speccompat.State.APPLIED, report


def _embeddings() -> Any:
    import torch

    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(0))


def _first_layer(layer: Any, embeddings: Any) -> list[Any]:
    """What ``KimiLinearModel.forward`` does on the first rank without attention residuals:
    append the embeddings as id 0, then run layer 0 with no residual."""
    import torch

    captured = [embeddings]  # aux_hidden_states.append(hidden_states)
    layer.forward(torch.arange(TOKENS), embeddings, None)
    return captured


@applies
def test_the_probe_passes_and_the_source_facts_hold() -> None:
    assert _probe() is None
    forward = source_text(MODEL, f"{STACK}.forward")
    capture = ALIASING_CAPTURE.search(forward)
    assert capture is not None
    before = forward[:capture.end()]
    assert ".clone()" not in before and "copy_(" not in before
    assert "residual = None" in before
    method = source_def(MODEL, f"{LAYER}.{METHOD}")
    assert method is not None and list(method.params) == PARAMS
    assert FIRST_RESIDUAL.search(method.text) is not None
    assert LAYER_FLAG in source_text(MODEL, f"{LAYER}.__init__")
    layer_forward = source_text(MODEL, f"{LAYER}.forward")
    assert f"self.{METHOD}(\n            hidden_states, residual, prefix_sum\n        )" in \
        layer_forward or f"self.{METHOD}(hidden_states, residual, prefix_sum)" in layer_forward
    post = source_text(MODEL, f"{LAYER}._post_attn_norm")
    assert "self.post_attention_layernorm(\n                hidden_states, residual\n" \
        "            )" in post or "self.post_attention_layernorm(hidden_states, residual)" in post


@applies
@pytest.mark.parametrize("kernel", KERNELS)
def test_raw_the_first_layer_adds_into_id_0(kernel: str) -> None:
    """Without the adapter: vLLM's own layer steps update the captured embeddings."""
    embeddings = _embeddings()
    before = embeddings.clone()
    captured = _first_layer(_layer_class()(kernel), embeddings)
    assert captured[0] is embeddings
    assert not captured[0].equal(before), "the in-place add did not reach id 0"


@applies
@pytest.mark.parametrize("kernel", KERNELS)
def test_normalized_id_0_keeps_the_embeddings(stand_in: type, kernel: str) -> None:
    import torch

    unpatched = _layer_class()(kernel)
    _apply(ID)
    assert vars(stand_in)[METHOD] is _pre_attn_norm
    embeddings = _embeddings()
    before = embeddings.clone()
    layer = stand_in(kernel)
    positions = torch.arange(TOKENS)
    out, _, residual = layer.forward(positions, embeddings, None)
    assert embeddings.equal(before), "id 0 is not the embeddings"
    # The layer computes what vLLM's unpatched layer computes.
    want_out, _, want_residual = unpatched.forward(positions, before.clone(), None)
    assert out.equal(want_out) and residual.equal(want_residual)
    # A later layer (a residual is given) is vLLM's own call: no copy.
    given = torch.ones(TOKENS, HIDDEN)
    hidden = _embeddings()
    _, prefix_sum, same = layer._pre_attn_norm(hidden, given, None)
    assert same is given and prefix_sum is None


@applies
def test_no_copy_with_attention_residuals_or_a_residual(stand_in: type) -> None:
    """The cost is nil where the aliasing cannot happen: with attention residuals (vLLM's
    attn_res branch gets its arguments untouched) and for every layer given a residual."""
    import torch

    _apply(ID)
    seen: list[tuple[Any, Any, Any]] = []

    def upstream(self: Any, hidden_states: Any, residual: Any, prefix_sum: Any) -> Any:
        seen.append((hidden_states, residual, prefix_sum))
        return hidden_states, prefix_sum, residual

    setattr(stand_in, UPSTREAM, upstream)  # records what vLLM's method would get
    states, prefix = _embeddings(), torch.zeros(TOKENS, HIDDEN)
    with_res = stand_in("torch", use_attn_res=True)
    with_res._pre_attn_norm(None, torch.zeros(TOKENS, 2, HIDDEN), prefix)
    with_res._pre_attn_norm(states, None, prefix)  # not vLLM's call, and still no copy
    without = stand_in("torch")
    residual = torch.ones(TOKENS, HIDDEN)
    without._pre_attn_norm(states, residual, None)
    without._pre_attn_norm(states, None, None)
    assert seen[0][0] is None
    assert seen[1][0] is states
    assert seen[2][0] is states and seen[2][1] is residual
    assert seen[3][0] is not states and seen[3][0].equal(states)


@applies
def test_the_replacement_pickles_by_name_and_revert_restores(stand_in: type) -> None:
    own = vars(stand_in)[METHOD]
    _apply(ID)
    replacement = vars(stand_in)[METHOD]
    assert replacement is _pre_attn_norm and vars(stand_in)[UPSTREAM] is own
    assert pickle.loads(pickle.dumps(replacement)) is replacement
    assert replacement.__closure__ is None
    speccompat.revert()
    assert vars(stand_in)[METHOD] is own and UPSTREAM not in vars(stand_in)


@applies
def test_the_adapter_waits_for_the_model_module() -> None:
    """Applied before vLLM imports the model (as in a server), it patches nothing yet."""
    assert MODEL not in sys.modules or not hasattr(sys.modules[MODEL], UPSTREAM)
    _apply(ID)
    try:
        assert ID in applied()
    finally:
        speccompat.revert()
    assert ID not in applied()


def _kimi_target(architecture: str) -> Any:
    from transformers import PretrainedConfig

    return PretrainedConfig(architectures=[architecture], num_hidden_layers=4,
                            attn_res_block_size=None)


def _draft(target: Any, ids: list[int]) -> Any:
    config_class = getattr(importlib.import_module(layer_ids.CONFIG), layer_ids.CONFIG_CLASS)
    return config_class(target, **{layer_ids.IDS: ids})


@applies
@pytest.mark.parametrize("architecture", ["KimiLinearForCausalLM",
                                          "KimiK3ForConditionalGeneration"])
def test_with_the_copy_the_layer_id_check_serves_id_0(architecture: str) -> None:
    """vLLM's own ExtractHiddenStatesConfig with the layer-id check: id 0 passes where the
    copy is applied in the process."""
    _apply(ID, layer_ids.ID)
    try:
        assert getattr(_draft(_kimi_target(architecture), [4, 0, 2]), layer_ids.IDS) == [0, 2, 4]
    finally:
        speccompat.revert()


@applies
@pytest.mark.parametrize("architecture", [
    # K3 serves aux states from 0.27.0 (as the adapter applies); Kimi-Linear from 0.28.0.
    "KimiK3ForConditionalGeneration",
    pytest.param("KimiLinearForCausalLM", marks=vllm_in(
        ">=0.28.0", "KimiLinearForCausalLM is not SupportsEagle3 before 0.28.0, so id 0 "
        "has nothing to refuse there (kimi_first_id.FIRST_RELEASE)")),
])
def test_skipped_the_copy_id_0_is_refused_again(monkeypatch: pytest.MonkeyPatch,
                                                architecture: str) -> None:
    """``SPECCOMPAT_SKIP=vllm.kimi_linear_first_layer_alias``: the plugin's selection skips
    it, ``patching.applied()`` does not list it, and the check refuses id 0 as before."""
    monkeypatch.setenv(SKIP_ENV, ID)
    report = registry._apply(only=[ID, layer_ids.ID], paths=(ExtractionPath.SERVER,),
                             judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.SKIPPED, report
        assert report.state_of(layer_ids.ID) is speccompat.State.APPLIED, report
        with pytest.raises(LayerIdError, match="in-place update instead of the embeddings"):
            _draft(_kimi_target(architecture), [0, 2, 4])
        assert getattr(_draft(_kimi_target(architecture), [4, 2, 1]),
                       layer_ids.IDS) == [1, 2, 4]
    finally:
        speccompat.revert()
