"""A hybrid verifier (tiny Qwen3-Next: gated-delta-net linear attention and full attention,
speccompat issue #20) through a real ``vllm serve`` on vLLM's CPU build, with the stock
connector and the worker in a process of its own (``--distributed-executor-backend mp``,
the case that read zeros on vLLM 0.24 CUDA): every file whole, no all-zero row (the zero-row
guard stays silent), every id against an HF float32 forward of the same weights.

vLLM's CPU build runs this model from 0.25 on here (0.23/0.24 cannot start a speculative
engine on CPU, see tests/cpu_build.py); the 0.24 block-size bug itself is proven on the GPU
host (tests/gpu/test_hybrid_zero_rows.py) and by the adapter's contract test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import server
from support import requires_vllm

pytestmark = requires_vllm
LENGTHS = (5, 40, 300)
# --dtype float32 against HF float32 on the same weights; the chunked gated-delta-net
# kernels sum in another order than HF's reference loop.
FP32_MEAN_BOUND = 1e-3


@pytest.fixture(scope="module")
def qwen3_next_fp32(models_dir: Path) -> Path:
    import tiny_models

    server.skip_unless_the_cpu_build_serves()
    return tiny_models.build_qwen3_next(models_dir / "qwen3-next-m1-fp32", dtype="float32")


def test_hybrid_every_id_whole_and_as_hf(qwen3_next_fp32: Path, tmp_path: Path) -> None:
    import hf_reference
    import tiny_models

    num_layers = int(json.loads((qwen3_next_fp32 / "config.json").read_text())[
        "num_hidden_layers"])
    ids = [1, 2, num_layers]
    prompts = tiny_models.make_prompts(tiny_models.VOCAB_SIZE, list(LENGTHS), seed=17)
    with server.serve(qwen3_next_fp32, tmp_path, ids, "--dtype", "float32",
                      "--distributed-executor-backend", "mp") as srv:
        states = [server.fetch_states(srv, prompt) for prompt in prompts]
        log = srv.log_tail(10**7)
    assert "server-path adapters applied" in log
    assert "refused to write" not in log  # the zero-row guard
    reference = hf_reference.layer_inputs(qwen3_next_fp32, prompts)
    for prompt, got, want in zip(prompts, states, reference, strict=True):
        assert tuple(got.shape) == (len(prompt), len(ids), want[0].shape[-1])
        assert int((got == 0).all(dim=2).any(dim=1).sum()) == 0
        for slot, layer in enumerate(ids):
            mean, worst = hf_reference.relative_errors(got[:, slot], want[layer])
            print(f"{len(prompt)} tokens, id {layer}: mean {mean:.2e}, max {worst:.2e}")
            assert mean < FP32_MEAN_BOUND, (len(prompt), layer, mean)
