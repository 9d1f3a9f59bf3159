"""Upstream bugs of vLLM's CPU builds that the tests step around, in one place.

Each was measured without speccompat's part in it (vLLM's own engine fails or differs
the same way, or the failing code is vLLM's kernel), so it is no contract speccompat
can keep, and CUDA builds do not take these paths. CHANGELOG.md lists them for users.
A test skips with ``BUG.skip_if_present(what_checks_it_instead)``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

import speccompat
from speccompat.versions import spec


def _has_cpu_flag(flag: str) -> bool:
    """Whether the kernel's CPU flags list ``flag`` (torch 2.11 has no
    _is_amx_tile_supported; vLLM picks its AVX2 library where ``avx512f`` is missing)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return any(line.startswith("flags") and f" {flag}" in line for line in cpuinfo)
    except OSError:
        return False


@dataclass(frozen=True)
class CpuBuildBug:
    summary: str
    vllm: str = ""  # the releases it was measured on, as a specifier; "" for any
    ipex_only: bool = False  # only builds that ship intel_extension_for_pytorch
    amx_only: bool = False  # only on processors with AMX tiles
    without_avx512_only: bool = False  # only on processors without AVX-512 (vLLM's AVX2 library)
    transformers: str = ""  # the transformers releases it was measured with; "" for any

    def present(self) -> bool:
        env = speccompat.detect()
        if env.platform != "cpu" or env.vllm is None:
            return False
        if self.vllm and env.vllm.version not in spec(self.vllm):
            return False
        if self.amx_only and not _has_cpu_flag("amx_tile"):
            return False
        if self.without_avx512_only and _has_cpu_flag("avx512f"):
            return False
        if self.transformers and (env.transformers is None
                                  or env.transformers.version not in spec(self.transformers)):
            return False
        return not self.ipex_only or importlib.util.find_spec(
            "intel_extension_for_pytorch") is not None

    def skip_if_present(self, checked_instead: str) -> None:
        if self.present():
            pytest.skip(f"vLLM CPU build: {self.summary}; {checked_instead}")


# 0.14.0 and 0.14.1's cpu_fused_moe builds its SiluAndMul op on first use, inside the
# forward, where no vLLM config is current ("Current vLLM config is not set"); vLLM's own
# multiprocess LLM fails to warm up the tiny DeepSeek V3 the same way. A test that runs
# the model in its own process can make the config current; a worker cannot. 0.15.0
# calls the op's forward_native instead.
MOE_OP_NEEDS_CURRENT_CONFIG = CpuBuildBug(
    "the fused-MoE activation op needs a current vLLM config inside the forward, so a MoE "
    "model cannot run in a worker process (its own engine fails the same way)",
    vllm=">=0.14.0,<0.15.0")

# Seen on 0.17.0's and 0.22.0's builds (0.16.0 runs it): "cpu_fused_moe.cpp: Check
# failed: output_size_13 % min_w13_n_tile_size == 0" for the tiny model's 16-wide MoE
# shard per rank.
FUSED_MOE_TP2_TILE = CpuBuildBug(
    "the fused-MoE kernel rejects the tiny DeepSeek's TP=2 shard", vllm=">=0.17.0")

# Measured on 0.11.0's x86 build with speculators 0.3.0 and 0.4.0 alike: dense layer 0
# within 1.6% of HF, the MoE layers 12-33% off. IPEX's GatedMLPMOE routes noaux_tc
# (e_score_correction_bias) unlike HF and vLLM's own grouped_topk (5% apart on one random
# MoE layer; 0.4% without the bias). 0.11.1's build has IPEX too (MoE layer 2 18% off);
# later builds run vLLM's own kernels.
IPEX_NOAUX_TC_ROUTING = CpuBuildBug(
    "IPEX's MoE kernel routes DeepSeek V3's noaux_tc experts unlike HF", ipex_only=True)

# Measured on 0.13.0: vLLM's own forward (in-process LLM, forward hooks on the decoder
# layers, neither speccompat nor speculators loaded) is as far from HF as the capture:
# dense layer 0 mean 0.960 on a 5-token prompt, token 0 right and every later one wrong,
# with the native rotary op and with either CPU attention backend. 0.11.x and 0.15.0 on
# match HF.
DEEPSEEK_WITHOUT_MLA_DIFFERS = CpuBuildBug(
    "vLLM's own DeepSeek V3 forward without MLA differs from HF after the first token",
    vllm=">=0.12.0,<0.15.0")

# Measured on 0.16.0 on a Xeon with AMX (amx_bf16): for a bf16 model at the default block
# size the CPU attention picks its AMX kernel, which rejects the tiny DeepSeek's 4 heads of
# 32 ("Unsupported CPU attention configuration: head_dim=32 isa=0", vLLM's own forward).
# 0.22.0 runs it on the same machine. Releases between were not measured there.
AMX_ATTENTION_HEAD_DIM_32 = CpuBuildBug(
    "the AMX attention kernel rejects a bf16 model with 4 heads of 32", vllm="<0.22.0",
    amx_only=True)

# The server path (``extract_hidden_states`` through ``vllm serve``) on the CPU builds.
# Read from the wheels and measured on 0.17.0: 0.17-0.19's CPU model runner asserts
# "spec decode is not supported" (0.20.0 added it). Measured with speccompat disabled: 0.23
# and 0.24's CPU triton stub lacks USE_FP64_GUMBEL, so no speculative-decoding engine starts
# at all (the issue's command fails the same way). (0.20-0.21's CPU runner, which never set
# the aux layers, is an adapter's: vllm.cpu_runner_aux_layers.)
SERVER_NO_SPEC_DECODE = CpuBuildBug(
    "the CPU model runner refuses speculative decoding ('spec decode is not supported')",
    vllm="<0.20.0")
# Measured on 0.20.0 with speccompat disabled and an ngram speculative config (2026-12-02):
# the engine dies at start-up in the CPU rejection sampler ("_rejection_greedy_sample_kernel_
# impl() got an unexpected keyword argument 'SYNTHETIC_MODE'"); 0.21.0 starts. 0.20.1 and
# 0.20.2 ship the same vllm/utils/cpu_triton_utils.py and v1/sample/rejection_sampler.py
# as 0.20.0, byte for byte (read from the wheels); 0.21.0's stub takes SYNTHETIC_MODE.
SERVER_REJECTION_SAMPLER_SYNTHETIC_MODE = CpuBuildBug(
    "no speculative-decoding engine starts (the CPU rejection sampler takes no "
    "SYNTHETIC_MODE)", vllm=">=0.20.0,<0.21.0")
SERVER_SPEC_DECODE_GUMBEL = CpuBuildBug(
    "no speculative-decoding engine starts (the CPU triton stub lacks USE_FP64_GUMBEL)",
    vllm=">=0.23.0,<0.25.0")
SERVER_PATH_BUGS = (SERVER_NO_SPEC_DECODE, SERVER_REJECTION_SAMPLER_SYNTHETIC_MODE,
                    SERVER_SPEC_DECODE_GUMBEL)


def server_path_blocker() -> str:
    """Why this CPU build cannot run the server path at all ("" where it can): the matrix
    records such a server-path cell as contract only with this reason (noxfile.py), whatever
    start-up checks still pass there."""
    present = [bug for bug in SERVER_PATH_BUGS if bug.present()]
    return f"vLLM CPU build: {present[0].summary}" if present else ""


# Measured on 0.20.0, 0.21.0 (their cells with speculators 0.3.0) and 0.22.0 (and in CI at
# 902e864); 0.16.0 and 0.19.1 run it: a float32 MoE model takes cpu_fused_moe's torch path,
# whose op asks for the current vLLM config inside the worker's forward ("Current vLLM config
# is not set"); bf16 takes the compiled kernel and runs.
MOE_FP32_NEEDS_CURRENT_CONFIG = CpuBuildBug(
    "a float32 MoE forward asks for a current vLLM config inside the worker",
    vllm=">=0.20.0,<0.23.0")
# Measured on 0.22.0 on an AMD EPYC without AVX-512 (2026-12-05: the tiny DeepSeek V3 and
# Kimi-K2.5 in the generator's worker, the llama_4_scaling DeepSeek in an LLM): there vLLM
# loads its _C_AVX2 library, which has no grouped MoE kernel (no prepack_moe_weight in 0.20.0,
# 0.21.0, 0.22.0 and 0.22.1's, read from the wheels; 0.32.0's has it), so bf16 MoE layers take
# the torch path above too and fail the same way. On CPUs with AVX-512 bf16 runs.
MOE_WITHOUT_AVX512_NEEDS_CURRENT_CONFIG = CpuBuildBug(
    "on a CPU without AVX-512 every MoE forward takes the torch path that asks for a current "
    "vLLM config inside the worker (the AVX2 library has no grouped MoE kernel)",
    vllm=">=0.20.0,<0.23.0", without_avx512_only=True)
# Measured on 0.29.0 and 0.32.0 (0.26.0 runs it; 0.27-0.28 not run): a hybrid (Mamba-style)
# model's first request launches the Triton kernel precopy_mamba_align_fused_kernel[grid] in
# mamba_utils, which the CPU build's Triton stub turns into a plain function ("'function'
# object is not subscriptable").
HYBRID_PRECOPY_TRITON_KERNEL = CpuBuildBug(
    "a hybrid model's first request launches a Triton kernel the CPU build does not have",
    vllm=">=0.29.0")
# Measured with vLLM's own plain server (no speculative config, SPECCOMPAT_DISABLE=1): the
# tiny Qwen3-Next's first request dies in the CPU gated-delta-rule kernel
# (chunk_gated_delta_rule_cpu: "Input tensor dtype mismatch") on 0.26.0 under transformers
# 5.24.0 and on 0.25.0 under 5.19.0. The speccompat server failed the same way on 0.25.0 and
# 0.26.0 under 5.19.0, and on 0.26.0 under 5.6.2 (matrix cells of 2026-12-02). The test had
# passed once on 0.26.0, on 2026-12-01 under 5.6.2; what differed then is not known. 0.27.0
# under 5.19.0: the same kernel, now worded "initial_state dtype mismatch", with vLLM's own
# plain server (SPECCOMPAT_DISABLE=1, no speculative config) and with speccompat alike
# (2026-12-02). 0.25.1 under 5.19.0: "Input tensor dtype mismatch" with vLLM's own plain
# server (SPECCOMPAT_DISABLE=1, no speculative config) and in the speccompat cell alike
# (2026-12-03). 0.28.0 under 5.19.0: vLLM's own plain server dies on "initial_state dtype
# mismatch"; the speccompat cell's server (speculative config on) died earlier, in the
# precopy Triton kernel of HYBRID_PRECOPY_TRITON_KERNEL ("'function' object is not
# subscriptable") (2026-12-03). Not run: 0.27.1.
HYBRID_GDN_DTYPE_MISMATCH = CpuBuildBug(
    "a Qwen3-Next forward dies in the CPU gated-delta-rule kernel ('Input tensor dtype "
    "mismatch' / 'initial_state dtype mismatch', vLLM's own plain server too; seen under "
    "transformers 5.6.2, 5.19 and 5.24)",
    vllm=">=0.25.0,<=0.28.0")
