"""DeepseekV2Model captures aux id k as ``hidden_states + residual`` before decoder layer k,
and the residual is still None before layer 0: id 0 (the embeddings) fails at warm-up or at
the first request on every release with the capture (0.18.0 .. 0.32.0). The adapter hands
vLLM's forward the embeddings as ``inputs_embeds``, hides id 0 from its loop and puts a copy
in id 0's slot.

Raw, normalized and fails-without-it run a real server (tests/serving.py) on the tiny
DeepSeek V3; id 0 is compared with HF's ``output_hidden_states[0]`` bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

import serving
from speccompat import registry
from speccompat.server.adapters.deepseek_first_layer_residual import DEEPSEEK, ID, MODEL, _probe
from speccompat.server.adapters.extract_hidden_states_layer_ids import ID as LAYER_ID_CHECK
from support import needs_adapter, requires_vllm, source_text

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM before 0.18.0 has no DeepSeek aux capture at all")
IDS = [0, 1, 2]
# bf16 model, HF in float32 on the same weights: mean absolute difference relative to the
# mean magnitude (a bf16 MoE can route one token differently, so not the largest). Id 0 is
# the embedding lookup itself: exact.
BF16_MEAN_BOUND = 0.05


def _prompts() -> list[list[int]]:
    import tiny_models

    return tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [7, 33], seed=5)


@applies
def test_raw_the_residual_is_none_before_the_first_layer() -> None:
    forward = source_text(DEEPSEEK, f"{MODEL}.forward")
    first = forward.index("residual = None")
    assert forward.index("hidden_states + residual") > first
    assert _probe() is None


@applies
def test_raw_id_0_fails_before_any_file(tiny_deepseek: Path, tmp_path: Path) -> None:
    """Without the adapter (and without the start-up check that would refuse id 0): a
    TypeError adding None, at warm-up (the server never gets ready) or at the first
    request (the engine dies)."""
    serving.skip_unless_the_cpu_build_serves()
    env = {**serving.DEEPSEEK_CPU_ENV, "SPECCOMPAT_SKIP": f"{ID},{LAYER_ID_CHECK}"}
    try:
        with serving.serve(tiny_deepseek, tmp_path, IDS, *serving.DEEPSEEK_CPU_ARGS,
                          *serving.NO_CHUNKED_PREFILL, env=env) as srv:
            status, _ = srv.completion(_prompts()[0])
            assert status != 200
            serving.wait_for_engine_death(srv)
    except RuntimeError as error:
        assert "exited" in str(error)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "unsupported operand type(s) for +" in log and "NoneType" in log, log[-4000:]


@applies
def test_normalized_id_0_is_the_embeddings(tiny_deepseek: Path, tmp_path: Path) -> None:
    import hf_reference

    serving.skip_unless_the_cpu_build_serves(moe_model=True)
    prompts = _prompts()
    with serving.serve(tiny_deepseek, tmp_path, IDS, *serving.DEEPSEEK_CPU_ARGS,
                      *serving.NO_CHUNKED_PREFILL, env=serving.DEEPSEEK_CPU_ENV) as srv:
        states = [serving.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_text()
    assert ID in log
    reference = hf_reference.layer_inputs(tiny_deepseek, prompts)
    for got, want in zip(states, reference, strict=True):
        assert tuple(got.shape)[:2] == (len(want[0]), len(IDS))
        assert got[:, 0].float().equal(want[0]), "id 0 is not the embedding lookup"
        for slot, layer in enumerate(IDS[1:], start=1):
            mean, _ = hf_reference.relative_errors(got[:, slot], want[layer])
            print(f"id {layer}: mean relative error vs HF fp32 {mean:.2e}")
            assert mean < BF16_MEAN_BOUND, f"id {layer}: {mean:.3e}"


@pytest.mark.parametrize("ids", [[0, 1, 2], [2, 3]])
@applies
def test_the_loop_gets_the_ids_without_0_and_a_flag(ids: list[int]) -> None:
    """vLLM's own set_aux_hidden_state_layers, wrapped, on a stand-in holder of the stack
    (only what the setter touches): the loop's ids leave 0 out, the flag says it was asked."""
    from types import SimpleNamespace

    import speccompat
    from speccompat.record import ExtractionPath
    from speccompat.server.aux_edges import SERVES_ID_0

    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        from vllm.model_executor.models import deepseek_v2

        holder = SimpleNamespace(model=SimpleNamespace())
        deepseek_v2.DeepseekV2ForCausalLM.set_aux_hidden_state_layers(holder, tuple(ids))
        assert holder.model.aux_hidden_state_layers == tuple(i for i in ids if i != 0)
        assert getattr(holder.model, SERVES_ID_0) is (0 in ids)
    finally:
        speccompat.revert()


@applies
def test_the_wrapped_forward_pickles_as_the_aot_compile_cache_does() -> None:
    """vLLM's AOT compile cache (torch's ``aot_compile``) saves the compiled forward with its
    closure, each function in it by name. Seen on 0.32.0 (CUDA and CPU): with the forward
    the adapter replaced in the wrapper's closure, ``DeepseekV2Model.forward`` by name was
    the wrapper, "Can't pickle ...: it's not the same object", and no cache was saved. The
    wrapper now keeps only names that resolve to themselves; revert restores the class."""
    import pickle

    from vllm.model_executor.models import deepseek_v2

    import speccompat
    from speccompat.record import ExtractionPath
    from speccompat.server.aux_edges import UPSTREAM_FORWARD

    stack = deepseek_v2.DeepseekV2Model
    own_forward = stack.forward
    report = registry._apply(only=[ID], paths=(ExtractionPath.SERVER,), judge_support=False)
    try:
        assert report.state_of(ID) is speccompat.State.APPLIED
        wrapper = stack.forward
        assert wrapper is not own_forward and getattr(stack, UPSTREAM_FORWARD) is own_forward
        closure = [cell.cell_contents for cell in wrapper.__closure__ or ()]
        assert own_forward not in closure
        assert pickle.loads(pickle.dumps(closure)) == closure
        with pytest.raises(pickle.PicklingError, match="not the same object"):
            pickle.dumps(own_forward)  # why it must stay out of the closure
    finally:
        speccompat.revert()
    assert stack.forward is own_forward and not hasattr(stack, UPSTREAM_FORWARD)
