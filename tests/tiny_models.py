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


def build_tokenizer(path: Path, extra_special: tuple[str, ...] = ()) -> None:
    """Write a WordLevel fast tokenizer (words ``t0`` .. ``t507``) to ``path``.

    ``extra_special`` tokens (Kimi's media tokens) replace the last words, keeping their ids.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    num_words = VOCAB_SIZE - len(vocab) - len(extra_special)
    vocab.update({f"t{i}": len(SPECIAL_TOKENS) + i for i in range(num_words)})
    vocab.update({tok: VOCAB_SIZE - len(extra_special) + i for i, tok in enumerate(extra_special)})
    extra = {"additional_special_tokens": list(extra_special)} if extra_special else {}
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
        **extra,
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
    return _publish(tmp, path, params)


def _publish(tmp: Path, path: Path, params: dict[str, Any]) -> Path:
    """Mark the finished build ``tmp`` complete and move it to ``path``."""
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


def build_qwen3(path: Path, *, num_layers: int = 4, hidden: int = 128,
                dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Build (or reuse) a random-weight ``Qwen3ForCausalLM`` (q/k norms, 4 heads / 2 KV
    heads of 64): a second stack on ``EagleModelMixin`` beside Llama, for the GPU tests."""
    params: dict[str, Any] = {"arch": "qwen3", "builder_version": BUILDER_VERSION,
                              "num_layers": num_layers, "hidden": hidden, "dtype": dtype,
                              "seed": seed}

    def make_config() -> PretrainedConfig:
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, max_position_embeddings=4096, initializer_range=0.2,
            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=BOS_ID,
            eos_token_id=EOS_ID, pad_token_id=PAD_ID, dtype=dtype)

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


#: Kimi-K2.5's media tokens (real ids 163602..163605); here the last four ids, pad last.
KIMI_MEDIA_TOKENS = ("<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>")
KIMI_MEDIA_PAD_ID = VOCAB_SIZE - 1
_KIMI_PROCESSOR_FILE = "kimi_k25_vision_processing.py"
_KIMI_CONFIG_FILE = "configuration_kimi_k25.py"
# The real checkpoint ships its config class as remote code; speculators' generator reads
# num_hidden_layers through AutoConfig(trust_remote_code=True). vLLM uses its own class.
_KIMI_CONFIG_SRC = '''from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**{k: v for k, v in text_config.items()
                                              if k != "model_type"})
        self.text_config = text_config
        self.vision_config = vision_config or {}
        super().__init__(**kwargs)
'''
_KIMI_PROCESSOR_SRC = '''"""Tiny stand-in for Kimi-K2.5's image processor."""
import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class KimiK25VisionProcessor(BaseImageProcessor):
    model_type = "kimi_k25"

    def __init__(self, media_proc_cfg=None, **kwargs):
        super().__init__(**kwargs)
        self.media_proc_cfg = dict(media_proc_cfg or {})
        self.num_frames_per_chunk = self.media_proc_cfg["temporal_merge_kernel_size"]

    def media_tokens_calculator(self, media):
        cfg = self.media_proc_cfg
        return (cfg["image_side"] // cfg["patch_size"] // cfg["merge_kernel_size"]) ** 2

    def preprocess(self, medias, return_tensors=None, **kwargs):
        medias = medias if isinstance(medias, list) else [medias]
        if not medias:
            return BatchFeature(data={}, tensor_type=return_tensors)
        side, p = self.media_proc_cfg["image_side"], self.media_proc_cfg["patch_size"]
        pixels, grids = [], []
        for media in medias:
            frames = media["video_chunk"] if media["type"] == "video_chunk" else [media["image"]]
            frames = [np.asarray(f.convert("RGB").resize((side, side))) for f in frames]
            x = (np.stack(frames).astype(np.float32) / 255.0 - 0.5) / 0.5
            t, n = x.shape[0], side // p
            x = x.reshape(t, n, p, n, p, 3).transpose(0, 1, 3, 5, 2, 4).reshape(-1, 3, p, p)
            pixels.append(torch.from_numpy(np.ascontiguousarray(x)))
            grids.append([t, n, n])
        data = {"pixel_values": torch.cat(pixels), "grid_thws": torch.tensor(grids)}
        return BatchFeature(data=data, tensor_type=return_tensors)
'''


def _kimi_vision_weights(vision: dict[str, Any], text_hidden: int, seed: int) -> dict[str, Any]:
    """Random float32 weights for every vision-tower and projector tensor vLLM loads."""
    h, mlp, p = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    side, merged, pos = vision["init_pos_emb_height"], h * 4, "vision_tower.patch_embed.pos_emb"
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p), f"{pos}.weight": (side, side, h),
        "mm_projector.proj.0.weight": (merged, merged),  # merge_kernel_size [2, 2]
        "mm_projector.proj.2.weight": (text_hidden, merged),
    }
    norms = ["vision_tower.encoder.final_layernorm", "mm_projector.pre_norm"]
    for i in range(vision["num_hidden_layers"]):
        block = f"vision_tower.encoder.blocks.{i}"
        norms += [f"{block}.norm0", f"{block}.norm1"]
        shapes.update({f"{block}.wqkv.weight": (3 * h, h), f"{block}.wo.weight": (h, h),
                       f"{block}.mlp.fc0.weight": (mlp, h), f"{block}.mlp.fc1.weight": (h, mlp)})
    shapes.update({f"{norm}.weight": (h,) for norm in norms})
    shapes.update({f"{n[:-7]}.bias": s[:1] for n, s in list(shapes.items()) if pos not in n})
    gen = torch.Generator().manual_seed(seed + 2)
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)  # norms near 1, so a skipped norm shows up
        out[name] = 1.0 + 0.1 * noise if name[:-7] in norms else 0.1 * noise
    return out


def build_kimi_k25(
    path: Path, *, num_layers: int = 4, hidden: int = 64, dtype: str = "bfloat16", seed: int = 0,
    text_model: Path | None = None,
) -> Path:
    """Build (or reuse) a random-weight ``KimiK25ForConditionalGeneration`` (vLLM >= 0.15).

    config.json has the real Kimi-K2.5 layout: ``model_type: kimi_k25``, a DeepseekV3
    ``text_config`` (``model_type: kimi_k2``), a one-block MoonViT ``vision_config`` (both the
    names vLLM reads and the real ``vt_*`` aliases), ``media_placeholder_token_id``. The
    language model is exactly :func:`build_deepseek_v3` with the same arguments, built into
    ``path / "text_only"`` and saved here under ``language_model.``: the HF reference for the
    text part is ``DeepseekV3ForCausalLM`` on :func:`kimi_text_reference` ``(path)``.

    The image processor is local remote code (``kimi_k25_vision_processing.py``; frames are
    resized to 56x56, 4 tokens each), which vLLM runs on a dummy image at startup even for
    text-only prompts: vLLM 0.15/0.16 load it with trust_remote_code forced on, 0.22 needs
    ``trust_remote_code=True``. The tokenizer's last four ids are Kimi's media tokens
    (``<|media_pad|>`` is ``KIMI_MEDIA_PAD_ID``). vLLM CPU settings as for
    :func:`build_deepseek_v3`. vLLM 0.15.x's CPU build loads it only with speccompat applied
    (vLLM 0.16.0 fixed both upstream): Kimi's ``__init__`` calls ``torch.cuda.current_device()``
    (adapter ``vllm.kimi_k25_cuda_current_device``) and its ``load_weights`` maps
    ``q_a_proj`` to ``fused_qkv_a_proj``, which the ``VLLM_MLA_DISABLE=1`` attention lacks
    (adapter ``vllm.kimi_k25_unfused_qkv_a_proj``).

    ``text_model`` replaces the built language model with a DeepseekV3 folder of width
    ``hidden`` (e.g. one with the real MLA head shapes the CUDA kernels need).
    """
    from safetensors.torch import load_file, save_file

    params: dict[str, Any] = {"arch": "kimi_k25", "builder_version": BUILDER_VERSION + 2,
                              "num_layers": num_layers, "hidden": hidden, "dtype": dtype,
                              "seed": seed, "text_model": str(text_model or "")}
    path = Path(path)
    if _is_complete(path, params):
        return path
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if text_model is not None:
        text_dir = Path(shutil.copytree(text_model, tmp / "text_only"))
    else:
        text_dir = build_deepseek_v3(tmp / "text_only", num_layers=num_layers, hidden=hidden,
                                     dtype=dtype, seed=seed)
    text_config = json.loads((text_dir / "config.json").read_text())
    text_config.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    size = {"num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 32,
            "intermediate_size": 64}
    vision: dict[str, Any] = {
        **size, **{f"vt_{k}": v for k, v in size.items()}, "patch_size": 14,
        "init_pos_emb_height": 4, "init_pos_emb_width": 4, "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed", "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger", "mm_hidden_size": 32, "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5, "text_hidden_size": hidden,
    }
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": text_config, "vision_config": vision, "ignore_index": -100,
        "media_placeholder_token_id": KIMI_MEDIA_PAD_ID, "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>", "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "tie_word_embeddings": False,
        "dtype": dtype, "auto_map": {"AutoConfig": f"{_KIMI_CONFIG_FILE[:-3]}.KimiK25Config"},
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / _KIMI_CONFIG_FILE).write_text(_KIMI_CONFIG_SRC)
    processor = {
        "auto_map": {"AutoImageProcessor": f"{_KIMI_PROCESSOR_FILE[:-3]}.KimiK25VisionProcessor"},
        # image_side is read by the local processor; the rest as in the real checkpoint,
        # scaled down, for vLLM's own fused processor (0.30+).
        "media_proc_cfg": {"patch_size": 14, "merge_kernel_size": 2, "image_side": 56,
                           "temporal_merge_kernel_size": 4, "image_mean": [0.5, 0.5, 0.5],
                           "image_std": [0.5, 0.5, 0.5], "in_patch_limit": 16,
                           "patch_limit_on_one_side": 4, "in_patch_limit_each_frame": 16,
                           "in_patch_limit_video": 16, "fixed_output_tokens": None},
    }
    (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    (tmp / _KIMI_PROCESSOR_FILE).write_text(_KIMI_PROCESSOR_SRC)
    text_weights = load_file(text_dir / "model.safetensors")
    tensors = {f"language_model.{k}": v for k, v in text_weights.items()}
    for name, tensor in _kimi_vision_weights(vision, hidden, seed).items():
        tensors[name] = tensor.to(getattr(torch, dtype))
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(tmp, extra_special=KIMI_MEDIA_TOKENS)
    return _publish(tmp, path, params)


def kimi_text_reference(path: Path) -> Path:
    """The ``DeepseekV3ForCausalLM`` folder with a :func:`build_kimi_k25` model's text weights."""
    return Path(path) / "text_only"


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


def build_qwen3_next(
    path: Path, *, num_key_value_heads: int = 2, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Build (or reuse) a random-weight ``Qwen3NextForCausalLM``, the hybrid verifier of
    speccompat issue #20 (model m1; m2 is ``num_key_value_heads=4``): 4 layers, linear
    attention (gated delta net) and full attention alternating, 4 routed experts, hidden
    256, vocabulary 1000 (the tokenizer's 512 words are its first ids). Every weight is
    drawn from ``normal_(0, 0.05)``, as in the issue.
    """
    params: dict[str, Any] = {
        "arch": "qwen3_next",
        "builder_version": BUILDER_VERSION,
        "num_key_value_heads": num_key_value_heads,
        "dtype": dtype,
        "seed": seed,
    }
    path = Path(path)
    if _is_complete(path, params):
        return path
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    config = Qwen3NextConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=num_key_value_heads, head_dim=128,
        partial_rotary_factor=0.25, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, dtype=dtype,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0, 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(tmp), safe_serialization=True)
    build_tokenizer(tmp)
    return _publish(tmp, path, params)
