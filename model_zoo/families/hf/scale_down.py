"""The generic tiny-config pass: scale down every size field of a transformers config, recursively.

It works on the config's ``to_dict()`` form and rebuilds the config with
``from_dict``, so fields a config derives in ``__post_init__`` (Swin's
``hidden_size`` from ``embed_dim`` and ``depths``) are derived again from the
shrunk values instead of being left stale. Every width becomes the same
``hidden`` (32 by default), which keeps nested configs consistent for free:
a projector that maps the vision width to the text width sees 32 on both
sides. Heads become ``heads`` (4) at ``head_dim = hidden // heads``; layers
become ``layers`` (2); experts ``experts`` (4) with top-2 routing; the
vocabulary ``VOCAB`` (256) with every special token id moved to the top of
it; channel lists map through one fixed function, so two lists that agreed
before (a backbone's outputs and a neck's inputs) still agree. Dropout,
layer drop and SpecAugment masking are switched off: a training step must
be deterministic (VAE sampling noise too).

What this gets wrong for a family is fixed in ``fixups.py``, not here.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

VOCAB = 256
SPECIAL_SPAN = 48  # the top of the vocabulary, where special ids live
IMAGE = 32
PATCH = 8
POSITIONS = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The target sizes of one scale-down pass (the ModelConfig's knobs, filled with defaults)."""

    layers: int = 2
    hidden: int = 32
    heads: int = 4
    experts: int = 4
    image: int = IMAGE
    vocab: int = VOCAB

    @property
    def head_dim(self) -> int:
        return max(2, self.hidden // self.heads)

    @property
    def intermediate(self) -> int:
        return 2 * self.hidden


LAYER_EXACT = {"num_self_attends_per_block", "depth", "n_layer", "n_layers", "num_layers", "layers", "resampler_depth", "num_blocks"}
LAYER_KEEP = ("feat_extract", "kv_shared", "nextn", "conv_layers", "num_adapter_layers", "pos_conv", "decoder_layers_per_block")
WIDTH_EXACT = {"d_latents", "vit_dim", "bottleneck_features", "condition_dim", "projector_input_dim", "projector_output_dim", "vision_output_dim", "intra_bottleneck_size", "true_hidden_size", "d_model", "n_embd", "dim", "embedding_size", "projection_dim", "word_embed_proj_dim", "emb_dim", "d_embed",
               "hidden_dim", "output_dim", "text_embed_dim", "vision_embed_dim", "projection_size", "d_inner_model",
               "classifier_proj_size", "xvector_output_dim", "codevector_dim", "proj_codevector_dim", "embed_dim",
               "conv_channels", "d_latent", "proj_dim", "latent_dim"}
WIDTH_SUFFIX = ("hidden_size", "hidden_dim", "embed_dim", "embedding_dim", "embed_size", "hidden_channels")
INTERMEDIATE_EXACT = {"ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "mlp_dim", "intermediate_dim",
                      "d_inner", "ff_dim", "dim_feedforward", "ffn_hidden_size"}
INTERMEDIATE_SUFFIX = ("intermediate_size", "ffn_dim", "intermediate_dim")
HEAD_DIM_EXACT = {"d_head", "head_dim", "d_kv", "dim_head", "attention_head_size", "attention_head_dim", "qk_nope_head_dim",
                  "v_head_dim", "linear_key_head_dim", "linear_value_head_dim", "index_head_dim", "swa_head_dim",
                  "resampler_head_dim", "query_pre_attn_scalar", "kv_channels", "head_size", "linear_head_dim"}
EXPERT_EXACT = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts",
                "n_experts", "num_experts_total", "moe_num_routed_experts"}
TOPK_EXACT = {"num_experts_per_tok", "moe_topk", "top_k", "experts_per_token", "num_selected_experts", "moe_top_k",
              "num_experts_per_token", "router_top_k", "moe_k"}
POSITION_EXACT = {"max_position_embeddings", "n_positions", "max_target_positions", "max_text_len", "max_seq_len",
                  "max_sequence_length", "n_ctx", "seq_length", "max_length_text"}
LIST_WIDTH_KEYS = ("stem_channels", "out_features_channels", "fine_fusion_dims", "hidden_sizes", "embed_dims", "dims", "neck_hidden_sizes", "backbone_channel_list", "encoder_in_channels",
                   "stage_out_channels", "stage_in_channels", "stage_mid_channels", "embed_dim_per_stage", "conv_dim",
                   "tdnn_dim", "downsample_channels", "decoder_in_channels", "hidden_channels", "channels_list",
                   "block_out_channels", "channels", "widths", "out_channels_list", "encoder_hidden_sizes", "dim_mults_ch",
                   "decoder_hidden_sizes", "in_channels_list", "stage_channels", "num_channels_list")
LIST_DEPTH_KEYS = ("depths", "stage_depths", "blocks_per_stage", "stage_num_blocks", "num_blocks", "layers_per_stage",
                   "stage_numb_of_layers", "block_repeats", "num_layers_per_stage", "stage_num_layers", "encoder_layers_per_stage")
LIST_HEADS_KEYS = ("num_heads", "num_attention_heads", "num_attention_heads_per_stage", "heads", "attention_heads")
INDEX_LIST_KEYS = ("window_block_indices", "global_attn_indexes", "fullatt_block_indexes", "deepstack_visual_indexes", "mlp_only_layers",
                   "full_attention_layers", "full_attn_idxs", "cross_attention_layers", "sliding_window_layers",
                   "attn_layer_indices", "attn_layer_idx", "global_attention_layers")
TOKEN_SUFFIX = ("_token_id", "_token_index", "token_id", "_token_ids", "_id_token")
OFF_FLAGS = {"apply_spec_augment": False, "use_cache": False, "output_router_logits": False, "gradient_checkpointing": False}
ZERO_FLOATS = ("router_jitter_noise", "jitter_noise", "input_jitter_noise", "moe_jitter_eps", "router_jitter",
               "mask_time_prob", "mask_feature_prob", "layerdrop", "random_mask_ratio", "mask_ratio", "noise_std",
               "drop_rate", "stochastic_depth", "mask_prob", "masking_ratio", "vae_std")


RANDOM_AUGMENTATIONS = {"pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale", "pos_embed_rope_shift_coords",
                        "pos_embed_rope_jitter_coords", "pos_embed_rope_rescale_coords"}
PLACEHOLDER_TOKENS = {"image_token_id", "image_token_index", "video_token_id", "video_token_index", "audio_token_id",
                      "audio_token_index"}
FILL_NONE = {"head_dim": lambda p: p.head_dim, "num_key_value_heads": lambda p: p.heads, "vocab_size": lambda p: p.vocab,
             "num_experts_per_tok": lambda p: 2}


def _has_experts(d: dict[str, Any]) -> bool:
    return any(_is_int(d.get(k)) and d[k] > 1 for k in EXPERT_EXACT)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(_is_int(x) for x in v)


def list_width(v: int) -> int:
    """The fixed map for channel counts: up to 32 stays, 33-512 becomes 32 (as scalar widths do), larger
    divides by 16 (rounded up to 8), so stage-wise growth survives in the deepest stages."""
    if v <= 32:
        return v
    return max(32, int(math.ceil(v / 16 / 8)) * 8)


def _pow2_le(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def is_subconfig_dict(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value and isinstance(value.get("model_type"), str)


def _original_layers(d: dict[str, Any]) -> int | None:
    if _int_list(d.get("depths")):
        return None  # staged backbones (Swin): num_layers counts stages, and per-stage lists must keep their length
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "depth", "encoder_layers", "decoder_layers"):
        if _is_int(d.get(key)) and d[key] > 0:
            return d[key]
    return None


class TokenMap:
    """Moves special token ids that do not fit the tiny vocabulary to distinct ids at its top."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.moved: dict[int, int] = {}

    def __call__(self, value: int) -> int:
        if value < 0:
            return value
        if value < self.vocab - SPECIAL_SPAN:
            return value
        if value not in self.moved:
            self.moved[value] = self.vocab - 1 - len(self.moved) % SPECIAL_SPAN
        return self.moved[value]


def scale_down_dict(d: dict[str, Any], plan: Plan, tokens: TokenMap | None = None) -> dict[str, Any]:
    """A shrunk copy of a config dict (sub-config dicts included)."""
    tokens = tokens or TokenMap(plan.vocab)
    orig_layers = _original_layers(d)
    orig_heads = next((d[k] for k in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
                       if _is_int(d.get(k))), None)
    out: dict[str, Any] = {}
    for key, value in d.items():
        out[key] = _scale_down_value(key, value, d, plan, tokens, orig_layers, orig_heads)
    if out.get("is_encoder_decoder") and out.get("decoder_start_token_id") is None and _is_int(out.get("vocab_size")):
        out["decoder_start_token_id"] = out.get("pad_token_id") if _is_int(out.get("pad_token_id")) else 0
    if "pad_token_id" in out and out["pad_token_id"] is None and _is_int(out.get("vocab_size")):
        out["pad_token_id"] = tokens(1 << 40)  # sequence classification needs a pad id with batch > 1
    _fix_rope(out, plan)
    _fix_mla(out, plan)
    if _int_list(out.get("decoder_in_channels")) and _is_int(out.get("encoder_hidden_dim") or out.get("d_model")):
        # DETR-style decoders read the hybrid encoder's outputs, all at the encoder width
        width = out.get("encoder_hidden_dim") or out.get("d_model")
        out["decoder_in_channels"] = type(out["decoder_in_channels"])([width] * len(out["decoder_in_channels"]))
    _anchor_width_lists(d, out)
    _fix_backbone_outputs(d, out, plan)
    _fix_ssm(out, plan)
    _fix_forecast(out)
    return out


def _anchor_width_lists(orig: dict[str, Any], d: dict[str, Any]) -> None:
    """A per-stage width list that starts at the config's scalar width keeps its ratios from the new width."""
    for key in LIST_WIDTH_KEYS:
        values = orig.get(key)
        if not _int_list(values) or values[0] <= 0:
            continue
        for anchor in ("hidden_size", "embed_dim", "d_model"):
            if _is_int(orig.get(anchor)) and orig[anchor] == values[0] and _is_int(d.get(anchor)):
                d[key] = type(values)(max(1, d[anchor] * v // values[0]) for v in values)
                break


def _fix_backbone_outputs(orig: dict[str, Any], d: dict[str, Any], plan: Plan) -> None:
    """A ViT-style backbone whose outputs name layers that no longer exist keeps one layer per output."""
    for key in ("_out_indices", "out_indices"):
        idx = d.get(key)
        if not _int_list(idx) or "num_hidden_layers" not in d or not _is_int(d["num_hidden_layers"]):
            continue
        if max(idx) <= d["num_hidden_layers"] or "depths" in d or "hidden_sizes" in d:
            continue
        n = len(idx)
        d["num_hidden_layers"] = max(n, d["num_hidden_layers"])
        d[key] = type(idx)(range(d["num_hidden_layers"] - n + 1, d["num_hidden_layers"] + 1))
        names = "_out_features" if key == "_out_indices" else "out_features"
        if isinstance(d.get(names), (list, tuple)):
            d[names] = [f"stage{i}" for i in d[key]]
        if isinstance(d.get("stage_names"), list):
            d["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, d["num_hidden_layers"] + 1)]


def _fix_ssm(d: dict[str, Any], plan: Plan) -> None:
    """Mamba-2 style blocks: heads x head dim must equal expand x hidden."""
    for heads, head_dim, expand in (("mamba_n_heads", "mamba_d_head", "mamba_expand"),
                                    ("num_heads", "head_dim", "expand"), ("mamba_num_heads", "mamba_head_dim", "mamba_expand"),
                                    ("mamba_num_heads", "mamba_head_dim", "expand"),
                                    ("ssm_num_heads", "ssm_head_dim", "ssm_expand")):
        if all(_is_int(d.get(k)) for k in (heads, head_dim)) and _is_int(d.get(expand)) \
                and any(k in d for k in ("state_size", "mamba_d_state", "ssm_state_size", "mamba_d_conv", "n_groups", "mamba_n_groups")):
            width = d.get("hidden_size") if _is_int(d.get("hidden_size")) else plan.hidden
            inner = d[expand] * width
            d[head_dim] = min(d[head_dim], 8)
            d[heads] = max(1, inner // d[head_dim])
    for key in ("n_groups", "mamba_n_groups", "ssm_n_groups"):
        if _is_int(d.get(key)):
            d[key] = 1
    for key in ("state_size", "mamba_d_state", "ssm_state_size", "d_state"):
        if _is_int(d.get(key)):
            d[key] = min(d[key], 16)
    if d.get("time_step_rank") not in (None, "auto") and _is_int(d.get("time_step_rank")):
        d["time_step_rank"] = min(d["time_step_rank"], 8)
    for key in ("mamba_d_ssm", "mamba_intermediate_size", "ssm_intermediate_size"):
        if _is_int(d.get(key)):
            d[key] = 2 * (d.get("hidden_size") if _is_int(d.get("hidden_size")) else plan.hidden)


def _fix_forecast(d: dict[str, Any]) -> None:
    """Forecasting configs that leave the horizon unset (Autoformer, Informer ...) get a small one."""
    if d.get("num_time_features") == 0 and "lags_sequence" in d:
        d["num_time_features"] = 1  # the forward takes time features even when a config has none
    if "lags_sequence" in d:
        d.pop("feature_size", None)  # derived from the lags and feature counts; let the config recompute it
    if "prediction_length" in d and d["prediction_length"] is None:
        d["prediction_length"] = 4
    if "context_length" in d and d["context_length"] is None:
        d["context_length"] = 16
    if _is_int(d.get("context_length")) and d["context_length"] > 64:
        d["context_length"] = 32
    if _is_int(d.get("prediction_length")) and d["prediction_length"] > 32:
        d["prediction_length"] = 8


def _scale_down_value(key: str, value: Any, d: dict[str, Any], plan: Plan, tokens: TokenMap,
                  orig_layers: int | None, orig_heads: int | None) -> Any:
    k = key.lower()
    if is_subconfig_dict(value):
        return scale_down_dict(value, plan, tokens)
    if key in OFF_FLAGS and isinstance(value, bool):
        return OFF_FLAGS[key]
    if key in RANDOM_AUGMENTATIONS and value is not None:
        return None  # train-time random position-embedding augmentation (DINOv3 RoPE shift/jitter/rescale)
    if isinstance(value, float):
        if "drop" in k or k in ZERO_FLOATS or k.endswith("_pdrop"):
            return 0.0
        return value
    if value is None and key in PLACEHOLDER_TOKENS:
        return tokens(zlib.crc32(key.encode()) | 1 << 41)  # a placeholder id the model compares input_ids against
    if value is None and key in FILL_NONE and (key != "num_experts_per_tok" or _has_experts(d)):
        return FILL_NONE[key](plan)  # defaults that only a checkpoint would fill; the model reads them as ints
    if isinstance(value, bool) or value is None:
        return value
    if _is_int(value):
        return _scale_down_int(k, value, plan, tokens, orig_heads, d)
    if _int_list(value):
        return _scale_down_int_list(k, value, plan, tokens, orig_layers)
    if isinstance(value, (list, tuple)) and orig_layers and len(value) == orig_layers and orig_layers > plan.layers:
        return _per_layer(value, plan.layers)
    if isinstance(value, str) and "pattern" in k and orig_layers and len(value) == orig_layers > plan.layers:
        return "".join(_per_layer(list(value), plan.layers))  # a layer-pattern string ("M-M*-...")
    if k == "image_grid_pinpoints" and isinstance(value, list):
        return [[plan.image, plan.image]]  # any-resolution tiling: one tile of the tiny image size
    if isinstance(value, dict) and value and all(_int_like(x) for x in value) and orig_layers and orig_layers > plan.layers:
        # a per-layer table keyed by layer index (Gemma 4's per_layer_config): keep the layers that remain
        kept = {x: v for x, v in value.items() if int(x) < plan.layers}
        if not kept:  # keep the first entry, moved to the last remaining layer
            first = sorted(value, key=int)[0]
            kept = {type(first)(plan.layers - 1) if isinstance(first, int) else str(plan.layers - 1): value[first]}
        return kept
    return value


def _int_like(x: Any) -> bool:
    return _is_int(x) or (isinstance(x, str) and x.isdigit())


def _scale_down_int(k: str, v: int, plan: Plan, tokens: TokenMap, orig_heads: int | None, d: dict[str, Any]) -> int:
    if k.endswith(TOKEN_SUFFIX) or k in {"pad_token_id", "bos_token_id", "eos_token_id", "vocab_offset"}:
        return tokens(v) if k != "vocab_offset" else min(v, plan.vocab)
    if k in {"vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size", "text_vocab_size", "decoder_vocab_size",
             "padded_vocab_size", "audio_vocab_size", "codebook_vocab_size", "target_vocab_size", "label_vocab_size"}:
        return min(v, plan.vocab)
    if k in {"codebook_size", "num_embeddings", "n_embed", "num_codevectors_per_group", "codebook_dim", "num_codes"}:
        return min(v, 64) if k != "codebook_dim" else min(v, plan.hidden)
    if k in {"num_negatives"}:
        return min(v, 4)
    if k in EXPERT_EXACT:
        return min(v, plan.experts)
    if k in TOPK_EXACT:
        return min(v, 2, plan.experts)
    if k in {"n_group", "topk_group", "num_expert_group", "topk_groups"}:
        return 1
    if k in {"first_k_dense_replace", "first_k_dense", "moe_layer_start_index", "n_dense_layers"}:
        return min(v, 1)
    if k in {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "shared_experts"}:
        return min(v, 1)
    if k in {"kv_lora_rank", "q_lora_rank"}:
        return min(v, 16)
    if k == "qk_rope_head_dim":
        return min(v, 4)
    if k in {"rotary_dim", "rotary_emb_dim", "rope_dim", "rotary_ndims", "rotary_embedding_dim"}:
        return min(v, plan.head_dim)
    if k in HEAD_DIM_EXACT:
        return min(v, plan.head_dim)
    if k in {"num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "kv_heads",
             "swa_num_key_value_heads", "linear_num_key_heads", "n_head_kv", "num_key_value_groups"}:
        if orig_heads and v < orig_heads:
            return min(v, max(1, plan.heads // 2))
        return min(v, plan.heads)
    if k in {"num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads", "encoder_attention_heads",
             "decoder_attention_heads", "swa_num_attention_heads", "linear_num_value_heads", "num_attention_heads_text",
             "index_n_heads", "resampler_n_heads", "decoder_num_attention_heads", "num_head", "linear_num_heads"} \
            or k.endswith("_attention_heads") or k.endswith("_num_heads") or k.endswith("_n_heads"):
        return min(v, plan.heads)
    if k in {"num_hidden_layers", "encoder_layers", "decoder_layers", "num_encoder_layers", "num_decoder_layers",
             "max_window_layers"} or k in LAYER_EXACT or (k.endswith("_layers") and not any(s in k for s in LAYER_KEEP)):
        return min(v, plan.layers)
    if "kv_shared" in k:
        return 0
    if k in INTERMEDIATE_EXACT or k.endswith(INTERMEDIATE_SUFFIX):
        return min(v, plan.intermediate)
    if k in WIDTH_EXACT or k.endswith(WIDTH_SUFFIX):
        return min(v, plan.hidden)
    if k in POSITION_EXACT:
        return min(v, POSITIONS)
    if k in {"max_source_positions"}:
        return min(v, 64)
    if k in {"n_window", "audio_window_size", "chunk_length_frames"}:
        return min(v, 8)
    if k in {"n_window_infer"}:
        return min(v, 16)
    if k in {"image_size", "pretrain_image_size", "img_size", "input_image_size", "resolution", "crop_size"}:
        return min(v, plan.image)
    if k in {"patch_size", "patch_height", "patch_width"}:
        return min(v, PATCH)
    if k in {"num_pos_feats"}:
        return min(v, plan.hidden // 2)  # sine position features are concatenated to the hidden width
    if k in {"image_embedding_size", "image_embedding_side"}:
        return max(1, plan.image // PATCH)  # the image encoder's output grid (image // patch)
    if k in {"num_position_embeddings", "num_patches"}:
        grid = max(1, plan.image // PATCH)
        return min(v, grid * grid)
    if k in {"num_conv_pos_embeddings"}:
        return min(v, 16)
    if k in {"num_conv_pos_embedding_groups"}:
        return min(v, 4)
    if k in {"upsample_initial_channel", "subsampling_conv_channels", "fpn_hidden_size", "num_filters", "base_channels",
             "upsample_groups", "output_channels", "memory_encoder_output_channels", "mask_downsampler_embed_dim",
             "memory_fuser_embed_dim", "iou_head_hidden_dim", "auxiliary_channels", "latent_channels",
             "vector_quantization_hidden_dimension", "stem_channels", "decoder_hidden_dim", "encoder_hidden_dim"}:
        return min(v, plan.hidden)
    if "channel" in k and v > 32:
        return list_width(v)  # the same map as channel lists, so a scalar and a list that agreed still agree
    if k in {"image_seq_length", "num_image_tokens", "mm_tokens_per_image", "num_queries", "resampler_n_latents",
             "num_latents", "num_query_tokens", "query_num"}:
        return min(v, 16)
    if k in {"num_groups", "norm_num_groups", "num_norm_groups", "resnet_groups", "group_norm_groups"}:
        return min(v, 4)  # group norm groups must divide the (now narrow) channels
    if "feature_layer" in k and v < 0:
        return max(v, -plan.layers)  # a vision layer counted from the end must still exist
    if "feature_layer" in k and v > 0:
        return min(v, plan.layers - 1)
    if k in {"num_labels", "num_classes"}:
        return min(v, 10) if k == "num_classes" else v
    return v


def _scale_down_int_list(k: str, v: list[int] | tuple[int, ...], plan: Plan, tokens: TokenMap,
                     orig_layers: int | None) -> Any:
    kind = type(v) if isinstance(v, tuple) else list
    if k.endswith(TOKEN_SUFFIX) or k in {"eos_token_id", "bos_token_id", "suppress_tokens", "begin_suppress_tokens"}:
        return kind(tokens(x) for x in v)
    if k in LIST_DEPTH_KEYS:
        return kind(min(x, 2) for x in v)
    if k in LIST_HEADS_KEYS:
        return kind(_pow2_le(min(x, plan.heads)) for x in v)
    if k in LIST_WIDTH_KEYS:
        return kind(list_width(x) for x in v)
    if "feature_layer" in k:
        kept = list(dict.fromkeys(max(x, -plan.layers) if x < 0 else min(x, plan.layers - 1) for x in v))
        return kind(kept)
    if k in {"intermediate_hook_ids", "intermediate_layers_indices"}:
        return kind(min(x, plan.layers - 1) for x in v)  # paired with per-hook lists: keep the length
    if k in INDEX_LIST_KEYS:
        kept = sorted({min(x, plan.layers - 1) for x in v if x >= 0})
        return kind(kept or [plan.layers - 1])
    if k in {"image_size", "img_size", "input_size_hw"} and len(v) == 2:
        return kind(min(x, plan.image) for x in v)
    if k in {"patch_size"} and len(v) <= 3:
        return kind(min(x, PATCH) for x in v)
    if orig_layers and len(v) == orig_layers and orig_layers > plan.layers and k not in ("conv_kernel", "conv_stride"):
        return _per_layer(v, plan.layers)
    return v


def _per_layer(values: Any, n: int) -> Any:
    """The first ``n`` per-layer values, keeping one of each distinct kind (e.g. linear and full attention)."""
    kind = type(values) if isinstance(values, tuple) else list
    seq = list(values)
    head = seq[:n]
    try:
        missing = [x for x in dict.fromkeys(seq) if x not in head]
    except TypeError:  # unhashable entries
        return kind(head)
    for i, x in enumerate(missing[: n - 1]):
        head[n - 1 - i] = x
    return kind(head)


def rotary_half(d: dict[str, Any], rope: dict[str, Any], plan: Plan) -> int:
    """Half the rotated dims: head_dim x partial_rotary_factor / 2."""
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    factor = factor if isinstance(factor, (int, float)) and 0 < factor <= 1 else 1.0
    return int(_head_dim_of(d, plan) * factor) // 2


def _fix_rope(d: dict[str, Any], plan: Plan) -> None:
    """Rotary sections must add up to half the (new) rotated head dim."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = d.get(key)
        if not isinstance(rope, dict):
            continue
        nested = not ("rope_type" in rope or "rope_theta" in rope)
        groups = {k: dict(v) for k, v in rope.items() if isinstance(v, dict)} if nested else {None: dict(rope)}
        for group in groups.values():
            for name in ("mrope_section", "mrope_sections"):
                section = group.get(name)
                if _int_list(section):
                    group[name] = _split(max(len(section), rotary_half(d, group, plan)), section)
        d[key] = {**rope, **groups} if nested else groups[None]


def _head_dim_of(d: dict[str, Any], plan: Plan) -> int:
    if _is_int(d.get("head_dim")):
        return d["head_dim"]
    width, heads = d.get("hidden_size"), d.get("num_attention_heads")
    if _is_int(width) and _is_int(heads) and heads:
        return width // heads
    return plan.head_dim


def _split(total: int, weights: Any) -> list[int]:
    """``total`` split in the proportions of ``weights``, every part at least 1."""
    n = len(weights)
    parts = [1] * n
    left = total - n
    weight_sum = sum(weights) or n
    for i, w in enumerate(weights):
        add = int(left * w / weight_sum)
        parts[i] += add
    parts[-1] += total - sum(parts)
    return parts


def add_mrope_sections(d: dict[str, Any], plan: Plan) -> None:
    """M-RoPE models (Qwen2-VL and kin) fall back to a hard-coded [16, 24, 24] section when the config has none;
    give every text config one that fits the tiny head dim."""
    for value in d.values():
        if is_subconfig_dict(value):
            add_mrope_sections(value, plan)
    rope = d.get("rope_parameters")
    if "vocab_size" not in d or not isinstance(rope, dict):
        return
    def section(group: dict[str, Any]) -> list[int]:
        return group.get("mrope_section") or _split(max(3, rotary_half(d, group, plan)), [2, 3, 3])

    if "rope_type" in rope or "rope_theta" in rope:
        rope = {**rope, "mrope_section": section(rope)}
    else:  # one rope dict per layer type ({"full_attention": {...}, "sliding_attention": {...}})
        rope = {k: ({**v, "mrope_section": section(v)} if isinstance(v, dict) and "rope_type" in v else v)
                for k, v in rope.items()}
    d["rope_parameters"] = rope


def _fix_mla(d: dict[str, Any], plan: Plan) -> None:
    """Multi-head latent attention: the query head dim is nope + rope."""
    if _is_int(d.get("qk_nope_head_dim")) and _is_int(d.get("qk_rope_head_dim")):
        if "qk_head_dim" in d:
            d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        if _is_int(d.get("head_dim")):
            d["head_dim"] = d["qk_rope_head_dim"]  # the rotary embedding is sized by head_dim
