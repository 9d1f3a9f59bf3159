"""Tiny random-weight models built locally for tests (no model hub needed).

Every builder is deterministic in its arguments and idempotent: a folder that already
holds a complete model built with the same parameters is returned as it is.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

#: Special tokens; they take the first ids of the vocabulary, in this order.
SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(len(SPECIAL_TOKENS))
#: Total vocabulary size of the tokenizer (and of every model built here).
VOCAB_SIZE = 512
#: Bump when the output of a builder changes, so cached folders are rebuilt.
BUILDER_VERSION = 1
MARKER = "tiny_model.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def build_tokenizer(path: Path) -> None:
    """Write a WordLevel fast tokenizer (words ``t0`` .. ``t507``) to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{i}": len(SPECIAL_TOKENS) + i for i in range(VOCAB_SIZE - len(vocab))})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    tok.save_pretrained(str(path))


def _is_complete(path: Path, params: dict[str, Any]) -> bool:
    marker = path / MARKER
    if not all((path / name).is_file() for name in (MARKER, *_REQUIRED_FILES)):
        return False
    try:
        return bool(json.loads(marker.read_text()) == params)
    except (OSError, ValueError):
        return False


def _build_cached(path: Path, params: dict[str, Any], make_config: Callable[[], Any]) -> Path:
    """Build into a temporary sibling folder, then move it into place (safe across processes)."""
    path = Path(path)
    if _is_complete(path, params):
        return path
    from transformers import AutoModelForCausalLM

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    config = make_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(params["seed"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(params["seed"] + 1)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("norm.weight"):  # not all-ones, so a skipped norm shows up
                tensor.copy_(1.0 + 0.1 * torch.randn(tensor.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):  # routing depends on the bias
                tensor.copy_(0.2 * torch.randn(tensor.shape, generator=gen))
    model = model.to(getattr(torch, params["dtype"]))
    model.save_pretrained(str(tmp), safe_serialization=True)
    build_tokenizer(tmp)
    (tmp / MARKER).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    if path.exists():
        if _is_complete(path, params):  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
            return path
        shutil.rmtree(path)
    try:
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _is_complete(path, params):
            raise
    return path


def build_llama(
    path: Path, *, num_layers: int = 4, hidden: int = 64, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Build (or reuse) a random-weight ``LlamaForCausalLM`` with 4 heads / 2 KV heads.

    head_dim is at least 32: vLLM's CPU attention backend supports only head sizes
    32, 64, 80, ... (16 fails at the first forward with "Unsupported CPU attention
    configuration: head_dim=16").
    """
    params: dict[str, Any] = {
        "arch": "llama",
        "builder_version": BUILDER_VERSION,
        "num_layers": num_layers,
        "hidden": hidden,
        "dtype": dtype,
        "seed": seed,
    }

    def make_config() -> PretrainedConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=max(32, hidden // 4),
            max_position_embeddings=4096,
            initializer_range=0.2,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            dtype=dtype,
        )

    return _build_cached(path, params, make_config)


def build_deepseek_v3(
    path: Path,
    *,
    num_layers: int = 4,
    hidden: int = 64,
    dtype: str = "bfloat16",
    seed: int = 0,
    llama_4_scaling: dict[str, Any] | None = None,
) -> Path:
    """Build (or reuse) a random-weight ``DeepseekV3ForCausalLM`` (MLA + noaux_tc MoE).

    Layer 0 is dense, later layers are MoE (4 routed experts, top-2, 1 shared expert).
    ``llama_4_scaling`` (e.g. ``{"original_max_position_embeddings": 16, "beta": 0.5}``)
    is written to config.json; vLLM applies it but HF transformers ignores it, so HF parity
    only holds for positions below ``original_max_position_embeddings``.

    vLLM CPU needs ``VLLM_MLA_DISABLE=1`` (no MLA backend on CPU), and, for HF parity, the
    native RoPE: ``compilation_config={"custom_ops": ["all", "-rotary_embedding"]}``. The
    CPU rotary kernel (vLLM 0.16.0) reads heads as ``size(-1) // head_size`` and so
    rotates the wrong rows of the 3-D ``[tokens, heads, dim]`` query that the non-MLA
    DeepSeek attention passes it.
    """
    params: dict[str, Any] = {
        "arch": "deepseek_v3",
        "builder_version": BUILDER_VERSION,
        "num_layers": num_layers,
        "hidden": hidden,
        "dtype": dtype,
        "seed": seed,
        "llama_4_scaling": llama_4_scaling,
    }

    def make_config() -> PretrainedConfig:
        from transformers import DeepseekV3Config

        extra: dict[str, Any] = {}
        if llama_4_scaling is not None:
            extra["llama_4_scaling"] = dict(llama_4_scaling)
        return DeepseekV3Config(
            vocab_size=VOCAB_SIZE,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden // 2,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=16,
            v_head_dim=16,
            max_position_embeddings=4096,
            rope_scaling=None,
            initializer_range=0.2,
            tie_word_embeddings=False,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            topk_method="noaux_tc",
            scoring_func="sigmoid",
            num_nextn_predict_layers=0,
            dtype=dtype,
            **extra,
        )

    return _build_cached(path, params, make_config)


def hf_hidden_states(
    model_dir: Path, prompts: list[list[int]], *, dtype: torch.dtype = torch.float32
) -> list[tuple[torch.Tensor, ...]]:
    """Run HF transformers on each prompt alone and return its hidden states.

    Per prompt: a tuple of ``num_layers + 1`` tensors of shape ``[len(prompt), hidden]``.
    Index 0 is the embedding output and index ``k + 1`` the residual stream after decoder
    layer ``k``, except the LAST entry, which HF returns with the final norm applied
    (so compare vLLM layer ``k`` with index ``k + 1`` only for ``k < num_layers - 1``).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    out: list[tuple[torch.Tensor, ...]] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.long)
            res = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            out.append(tuple(h[0].detach().clone() for h in res.hidden_states))
    return out


def make_prompts(
    tokenizer_or_vocab_size: int | PreTrainedTokenizerBase, lengths: list[int], seed: int = 0
) -> list[list[int]]:
    """Deterministic random prompts of the given lengths, free of special tokens.

    An ``int`` is taken as the vocabulary size of a tokenizer from :func:`build_tokenizer`
    (special tokens first); a tokenizer is asked for its size and special ids.
    """
    if isinstance(tokenizer_or_vocab_size, int):
        size, special = tokenizer_or_vocab_size, set(range(len(SPECIAL_TOKENS)))
    else:
        size = len(tokenizer_or_vocab_size)
        special = set(tokenizer_or_vocab_size.all_special_ids)
    allowed = [i for i in range(size) if i not in special]
    rng = random.Random(seed)
    return [[rng.choice(allowed) for _ in range(n)] for n in lengths]
