"""Per-family knowledge: what the generic scale-down and the generic inputs get wrong, by model type.

Each table maps a model type (or a tuple of them) to a small function:

* ``PLAN``: changes to the tiny sizes (a model whose heads are ``hidden // 64`` needs hidden 64);
* ``BASE``: builds the default config where ``Config()`` alone does not work;
* ``DICT``: edits the shrunk config dict before the config is rebuilt (``orig`` is the unshrunk one);
* ``CONFIG``: edits the rebuilt config object;
* ``INPUTS``: returns the inputs, given the context and the generic rule.

Keep each fix small and say why it is needed.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .inputs import InputContext
from .scale_down import Plan

PLAN: dict[str, dict[str, int]] = {}
BASE: dict[str, Callable[[type], Any]] = {}
DICT: dict[str, Callable[..., None]] = {}
CONFIG: dict[str, Callable[..., None]] = {}
INPUTS: dict[str, Callable[[InputContext, Callable[[InputContext], dict]], dict]] = {}


def _for(table: dict, *types: str) -> Callable:
    def decorate(fn: Callable) -> Callable:
        for t in types:
            if t in table:
                raise ValueError(f"fix-up for {t!r} in {fn.__name__} is already defined")
            table[t] = fn
        return fn

    return decorate


def base_config(model_type: str, cls: type) -> Any:
    return BASE[model_type](cls) if model_type in BASE else cls()


def fix_plan(model_type: str, plan: Plan) -> Plan:
    from dataclasses import replace

    return replace(plan, **PLAN[model_type]) if model_type in PLAN else plan


def fix_config_dict(model_type: str, data: dict[str, Any], plan: Plan, *, size: int, modality: str,
                    orig: dict[str, Any]) -> None:
    if model_type in DICT:
        DICT[model_type](data, plan, size=size, modality=modality, orig=orig)


def fix_config(model_type: str, cfg: Any, plan: Plan, *, size: int, modality: str) -> None:
    if model_type in CONFIG:
        CONFIG[model_type](cfg, plan, size=size, modality=modality)


def construct(model_type: str, model_cls: type, cfg: Any, kwargs: dict[str, Any]) -> Any:
    """``model_cls`` from ``cfg``, or from the sub-config of the class it expects (a text-only head of a VLM type)."""
    wanted = getattr(model_cls, "config_class", None)
    if isinstance(wanted, type) and not isinstance(cfg, wanted):
        for value in vars(cfg).values():
            if isinstance(value, wanted):
                cfg = value
                break
    return model_cls._from_config(cfg, **kwargs)


def make_inputs(ctx: InputContext, generic: Callable[[InputContext], dict]) -> dict[str, Any]:
    fn = INPUTS.get(ctx.model_type)
    return fn(ctx, generic) if fn else generic(ctx)


# --- sizes the generic pass cannot guess -------------------------------------------------------------------

PLAN.update({
    "bridgetower": {"hidden": 64},  # its vision attention has hidden // 64 heads
    "bridgetower_vision_model": {"hidden": 64},
})


@_for(DICT, "swin", "donut-swin", "maskformer-swin", "swinv2")
def _swin_windows(d: dict, plan: Plan, **_: Any) -> None:
    """Windows must tile every stage: 2x2 patches, 2x2 windows on a 32-pixel image gives 16, 8, 4, 2 tokens a side."""
    d["patch_size"] = 2
    d["window_size"] = 2
    if isinstance(d.get("pretrained_window_sizes"), (list, tuple)):
        d["pretrained_window_sizes"] = [0] * len(d["pretrained_window_sizes"])


@_for(DICT, "efficientnet")
def _efficientnet_head(d: dict, plan: Plan, *, orig: dict, **_: Any) -> None:
    d["hidden_dim"] = orig["hidden_dim"]  # the head width is derived from the width coefficient, not free


@_for(DICT, "layoutlmv3")
def _layoutlm_spatial(d: dict, plan: Plan, **_: Any) -> None:
    # four coordinate and two shape embeddings are concatenated to the hidden width: 6 x 8 = 48
    d.update(hidden_size=48, coordinate_size=8, shape_size=8, input_size=plan.image)


@_for(DICT, "levit")
def _levit_resolution(d: dict, plan: Plan, **_: Any) -> None:
    d["patch_size"] = 16  # the conv stem always downsamples 16x; attention biases follow image_size // patch_size
    d["image_size"] = 64


@_for(DICT, "mobilevitv2", "mobilevit")
def _mobilevit_resolution(d: dict, plan: Plan, **_: Any) -> None:
    d["image_size"] = 64  # five stride-2 stages and 2x2 unfolding need at least 64 pixels


@_for(DICT, "encoder-decoder", "vision-encoder-decoder", "speech-encoder-decoder")
def _encoder_decoder_start(d: dict, plan: Plan, **_: Any) -> None:
    """The composite configs leave the decoder's start and pad ids to the checkpoint; training shifts labels with them."""
    d["decoder_start_token_id"] = 2
    d["pad_token_id"] = 0


@_for(DICT, "aria")
def _aria_queries(d: dict, plan: Plan, **_: Any) -> None:
    patches = (plan.image // d["vision_config"]["patch_size"]) ** 2
    d["projector_patch_to_query_dict"] = {patches: 4}  # image patches -> projector queries, keyed by the tiny count
    d["max_value_projector_patch_to_query_dict"] = 4


@_for(DICT, "audio-spectrogram-transformer")
def _ast_length(d: dict, plan: Plan, **_: Any) -> None:
    d.update(max_length=64, num_mel_bins=32, frequency_stride=8, time_stride=8)


@_for(INPUTS, "audio-spectrogram-transformer")
def _ast_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    out["input_values"] = ctx.randn(ctx.batch, ctx.config.max_length, ctx.config.num_mel_bins)  # (batch, time, mel)
    return out


@_for(INPUTS, "decision_transformer")
def _decision_inputs(ctx: InputContext, generic: Callable) -> dict:
    c, b, t = ctx.config, ctx.batch, ctx.size
    return {"states": ctx.randn(b, t, c.state_dim), "actions": ctx.randn(b, t, c.act_dim).tanh(),
            "rewards": ctx.randn(b, t, 1), "returns_to_go": ctx.randn(b, t, 1),
            "timesteps": torch.arange(t).expand(b, t).contiguous(), "attention_mask": torch.ones(b, t, dtype=torch.long)}


@_for(INPUTS, "deepseek_vl_hybrid")
def _deepseek_hybrid_inputs(ctx: InputContext, generic: Callable) -> dict:
    side = ctx.config.high_res_vision_config.image_size
    ctx.cache.setdefault("high_res", ctx.randn(ctx.batch, 3, side, side))
    out = generic(ctx)  # the image-token count needs both views; the generic count sees only pixel_values
    out["high_res_pixel_values"] = ctx.randn(ctx.batch, 3, side, side)
    return out


@_for(DICT, "deepseek_vl_hybrid")
def _deepseek_hybrid_sizes(d: dict, plan: Plan, **_: Any) -> None:
    d["high_res_vision_config"].update(image_size=64, window_size=2, global_attn_indexes=[1])


@_for(DICT, "efficientloftr")
def _loftr_width(d: dict, plan: Plan, **_: Any) -> None:
    d["hidden_size"] = d["out_features"][-1]  # the coarse transformer runs at the last stage's width
    # its 2-D rotary spans hidden / 2 dims as head_dim x partial_rotary_factor (4): head_dim must be hidden / 8
    d["num_attention_heads"] = d["num_key_value_heads"] = 8


@_for(DICT, "moonshine", "moonshine_streaming")
def _moonshine_heads(d: dict, plan: Plan, **_: Any) -> None:
    for key in list(d):
        if key.endswith("num_key_value_heads"):  # its attention views queries with the kv head count
            d[key] = d.get(key.replace("num_key_value_heads", "num_attention_heads"), plan.heads)
    if d.get("model_type") == "moonshine_streaming":  # its decoder reads a field the config class does not declare
        d.setdefault("num_key_value_heads", d["num_attention_heads"])


@_for(INPUTS, "lxmert")
def _lxmert_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    boxes = 4
    out["visual_feats"] = ctx.randn(ctx.batch, boxes, ctx.config.visual_feat_dim)
    out["visual_pos"] = torch.rand(ctx.batch, boxes, ctx.config.visual_pos_dim, generator=ctx.gen)
    return out


@_for(INPUTS, "kosmos-2")
def _kosmos_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    n = ctx.config.latent_query_num
    ids = torch.cat([torch.full((ctx.batch, n), 0), out["input_ids"]], 1)  # image embeddings overwrite these slots
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, :n] = True
    out.update(input_ids=ids, image_embeds_position_mask=mask, attention_mask=torch.ones_like(ids))
    if "labels" in out:
        out["labels"] = torch.cat([torch.full((ctx.batch, n), -100), out["labels"]], 1)
    return out


@_for(INPUTS, "lightglue", "superglue", "efficientloftr")
def _pair_inputs(ctx: InputContext, generic: Callable) -> dict:
    side = ctx.size if ctx.size >= 32 else 32
    channels = 1 if ctx.model_type == "efficientloftr" else 3
    return {"pixel_values": ctx.randn(ctx.batch, 2, channels, side, side)}  # image pairs to match


@_for(DICT, "fun_asr_nano")
def _fun_asr_adaptor(d: dict, plan: Plan, **_: Any) -> None:
    d["adaptor_config"]["intermediate_size"] = d["text_config"]["hidden_size"] // 4  # the adaptor's checked ratio


@_for(DICT, "reformer")
def _reformer_chunks(d: dict, plan: Plan, *, size: int, **_: Any) -> None:
    """Axial positions must factor the sequence and add up to the width; LSH hashing needs a fixed seed."""
    d.update(axial_pos_shape=[4, size // 4], axial_pos_embds_dim=[plan.hidden // 2, plan.hidden // 2],
             local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, hash_seed=0,
             attention_head_size=plan.head_dim, max_position_embeddings=size)


@_for(DICT, "step3p7", "step3p5")
def _step_window(d: dict, plan: Plan, **_: Any) -> None:
    text = d.get("text_config", d)
    if text.get("sliding_window") is None:
        text["sliding_window"] = 8  # the attention insists on a window even with no sliding layers


@_for(DICT, "timm_backbone", "timm_wrapper")
def _timm_backbone(d: dict, plan: Plan, **_: Any) -> None:
    d["backbone"] = d.get("backbone") or "resnet18"  # a timm architecture, built with random weights
    d["use_pretrained_backbone"] = False
    if "architecture" in d and not d.get("architecture"):
        d["architecture"] = "resnet18"


@_for(DICT, "timesfm")
def _timesfm_patches(d: dict, plan: Plan, *, size: int, **_: Any) -> None:
    d.update(patch_length=8, context_length=4 * size, horizon_length=16)


@_for(INPUTS, "timesfm")
def _timesfm_inputs(ctx: InputContext, generic: Callable) -> dict:
    length = ctx.config.context_length
    return {"past_values": ctx.randn(ctx.batch, length), "past_values_padding": torch.zeros(ctx.batch, length, dtype=torch.long),
            "freq": torch.zeros(ctx.batch, 1, dtype=torch.long)}  # one frequency class per series: (batch, 1)


@_for(INPUTS, "seggpt")
def _seggpt_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    height, width = ctx.config.image_size
    pixels = out["pixel_values"] = ctx.randn(ctx.batch, 3, height // 2, width)
    out["prompt_pixel_values"] = ctx.randn(*pixels.shape)
    out["prompt_masks"] = ctx.randn(*pixels.shape)
    return out


@_for(INPUTS, "oneformer")
def _oneformer_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    out["task_inputs"] = ctx.tokens(ctx.batch, ctx.config.task_seq_len if hasattr(ctx.config, "task_seq_len") else 8)
    return out


@_for(DICT, "lfm2_moe")
def _lfm2_layers(d: dict, plan: Plan, **_: Any) -> None:
    d["layer_types"] = (["conv", "full_attention"] * plan.layers)[: plan.layers]  # a checkpoint names the layer kinds
    d["num_dense_layers"] = min(d.get("num_dense_layers", 1), plan.layers - 1)


@_for(DICT, "dory")
def _dory_loops(d: dict, plan: Plan, *, orig: dict, **_: Any) -> None:
    # input, recurrent and output stacks must add up to the layer count; to_dict() stores every count doubled,
    # with each layer as an (attention, "mlp") pair, and from_dict halves them again
    d.update(num_hidden_layers=6, layer_types=["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention", "mlp"],
             n_input_layers=2, n_recurrent_layers=2, n_output_layers=2)


@_for(DICT, "dots1")
def _dots1_experts(d: dict, plan: Plan, **_: Any) -> None:
    d.update(n_routed_experts=plan.experts, n_shared_experts=1, num_experts_per_tok=2)  # None in the default


@_for(DICT, "dots3_note")
def _dots3_swa(d: dict, plan: Plan, **_: Any) -> None:
    text = d.get("text_config", d)
    for tower in ("vision_config", "audio_config"):  # the adapters map the tower width to the text width
        for key in ("adapter_in_dim", "adapter_input_size", "adapter_out_dim"):
            if key in (d.get(tower) or {}):
                d[tower][key] = plan.hidden
    audio = d["audio_config"]  # derived in __post_init__, but the stored full-size value wins
    audio["conv_output_size"] = audio["downsample_hidden_size"] * ((audio["feature_size"] + 7) // 8)
    nope, rope = text["qk_nope_head_dim"], text["qk_rope_head_dim"]
    for layer in (text.get("per_layer_config") or {}).values():  # the sliding layers' MLA overrides, left full-size
        layer.update(num_attention_heads=plan.heads, num_key_value_heads=plan.heads, kv_lora_rank=text["kv_lora_rank"],
                     q_lora_rank=text["q_lora_rank"], qk_nope_head_dim=nope, qk_rope_head_dim=rope, head_dim=nope + rope,
                     v_head_dim=text["v_head_dim"])


@_for(DICT, "gemma4_assistant", "gemma4_unified_assistant")
def _gemma_assistant(d: dict, plan: Plan, **_: Any) -> None:
    for sub in (d, d.get("text_config") or {}):
        if "hidden_size_per_layer_input" in sub:
            sub["hidden_size_per_layer_input"] = 0


@_for(DICT, "lw_detr", "lw_detr_vit")
def _lw_detr_windows(d: dict, plan: Plan, **_: Any) -> None:
    vit = d.get("backbone_config", d)
    vit.update(num_windows=4, num_windows_side=2)
    if "projector_scale_factors" in d and not d["projector_scale_factors"]:
        d.update(projector_scale_factors=[1.0], num_feature_levels=1)  # the default leaves the projector empty
    if isinstance(vit.get("window_block_indices"), list):
        vit["window_block_indices"] = [i for i in vit["window_block_indices"] if i < vit["num_hidden_layers"]] or [0]


@_for(DICT, "cohere_compass")
def _compass_rope(d: dict, plan: Plan, **_: Any) -> None:
    d["text_config"]["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}


@_for(DICT, "seggpt")
def _seggpt_canvas(d: dict, plan: Plan, **_: Any) -> None:
    d["image_size"] = [2 * plan.image, plan.image]  # the prompt and the input are stacked into one tall canvas


@_for(DICT, "sam2", "sam2_video", "sam2_hiera_det_model", "sam2_vision_model")
def _sam2_channels(d: dict, plan: Plan, **_: Any) -> None:
    """Hiera doubles its width per stage; the FPN neck lists those widths, deepest first."""
    vision = d.get("vision_config", d)
    backbone = vision.get("backbone_config", vision)
    width = backbone.get("hidden_size") or backbone.get("embed_dim")
    stages = len(backbone.get("blocks_per_stage") or [1, 2, 7, 2])
    if isinstance(width, int) and "backbone_channel_list" in vision:
        vision["backbone_channel_list"] = [width * 2**i for i in reversed(range(stages))]
    if "window_size_per_stage" in backbone:  # 32 px / stride 4 -> 8, 4, 2, 1 tokens a side
        backbone["window_size_per_stage"] = [2, 2, 2, 1][:stages]
        backbone["window_positional_embedding_background_size"] = [2, 2]
    if "global_attention_blocks" in backbone:
        backbone["global_attention_blocks"] = [sum(backbone["blocks_per_stage"]) - 1]
    if "backbone_feature_sizes" in vision:  # the FPN maps at strides 4, 8, 16 of the tiny image
        vision["backbone_feature_sizes"] = [[plan.image // s] * 2 for s in (4, 8, 16)]
    if "prompt_encoder_config" in d:  # the prompt grid is the image embedding's: 16x down, not the shrunk patch size
        d["prompt_encoder_config"]["patch_size"] = 16


@_for(DICT, "xmod")
def _xmod_language(d: dict, plan: Plan, **_: Any) -> None:
    d["default_language"] = d.get("default_language") or (d.get("languages") or ["en_XX"])[0]


@_for(INPUTS, "vit_mae")
def _mae_noise(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    patches = (ctx.config.image_size // ctx.config.patch_size) ** 2
    out["noise"] = torch.rand(ctx.batch, patches, generator=ctx.gen)  # the masking draws from here, not the global RNG
    return out


@_for(DICT, "vilt")
def _vilt_all_patches(d: dict, plan: Plan, **_: Any) -> None:
    d["max_image_length"] = -1  # otherwise training samples image patches at random


@_for(DICT, "tvp")
def _tvp_prompt(d: dict, plan: Plan, **_: Any) -> None:
    d.update(max_img_size=plan.image, visual_prompt_size=4)


@_for(CONFIG, "dbrx")
def _dbrx_attention(cfg: Any, plan: Plan, **_: Any) -> None:
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    cfg.attn_config.rope_theta = theta  # the attention still reads rope_theta from its own sub-config
    if getattr(cfg.attn_config, "clip_qkv", None) is None:
        cfg.attn_config.clip_qkv = 8.0  # it clamps unconditionally


def _set_nested(d: dict, model_type: str, **values: Any) -> None:
    if d.get("model_type") == model_type:
        for k, v in values.items():
            d.setdefault(k, v)
    for v in d.values():
        if isinstance(v, dict):
            _set_nested(v, model_type, **values)


@_for(DICT, "qwen3_omni_moe", "qwen3_omni_moe_talker_text")
def _talker_shared_expert(d: dict, plan: Plan, **_: Any) -> None:
    _set_nested(d, "qwen3_omni_moe_talker_text", shared_expert_intermediate_size=plan.intermediate)


@_for(INPUTS, "musicgen", "musicgen_melody")
def _musicgen_codebooks(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    k = ctx.text_config.num_codebooks
    ids = ctx.tokens(ctx.batch * k, ctx.size)  # one row per codebook
    out.update(input_ids=ids, attention_mask=torch.ones(ctx.batch, ctx.size, dtype=torch.long))
    out.pop("labels", None)
    return out


@_for(DICT, "apertus1p5")
def _apertus_offsets(d: dict, plan: Plan, **_: Any) -> None:
    for sub in (d, d.get("text_config") or {}):
        if "image_token_offset" in sub:
            size = sub.get("codebook_size", 64)
            sub["image_token_offset"] = 64
            sub["audio_token_offset"] = 64 + size


@_for(INPUTS, "mllama")
def _mllama_inputs(ctx: InputContext, generic: Callable) -> dict:
    vision = ctx.config.vision_config
    tiles, b = vision.max_num_tiles, ctx.batch
    side = vision.image_size
    ids = torch.cat([torch.full((b, 1), ctx.config.image_token_index), ctx.tokens(b, ctx.size)], 1)
    cross = torch.zeros(b, ids.shape[1], 1, tiles, dtype=torch.long)
    cross[..., 0] = 1
    mask = torch.zeros(b, 1, tiles, dtype=torch.long)
    mask[..., 0] = 1
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": ctx.randn(b, 1, tiles, 3, side, side),
           "aspect_ratio_ids": torch.ones(b, 1, dtype=torch.long), "aspect_ratio_mask": mask, "cross_attention_mask": cross}
    if "labels" in ctx.params and ctx.task != "base":
        out["labels"] = ids.clone()
    return out


@_for(INPUTS, "univnet")
def _univnet_noise(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    frames = out["input_features"].shape[1]
    out["noise_sequence"] = ctx.randn(ctx.batch, frames, ctx.config.model_in_channels)  # else drawn from the global RNG
    return out


@_for(INPUTS, "pix2struct")
def _pix2struct_patches(ctx: InputContext, generic: Callable) -> dict:
    """Pix2Struct reads flattened patches: (row, column, patch values) per position, with a patch mask."""
    vision = ctx.config.vision_config
    n, b = 16, ctx.batch
    rows = torch.arange(n) // 4
    cols = torch.arange(n) % 4
    index = torch.stack([rows, cols], -1).float().expand(b, n, 2)
    patches = torch.cat([index, ctx.randn(b, n, vision.patch_embed_hidden_size)], -1)
    out = {"flattened_patches": patches, "attention_mask": torch.ones(b, n, dtype=torch.long)}
    out["labels" if ctx.task != "base" else "decoder_input_ids"] = ctx.tokens(b, 8)
    return out


@_for(INPUTS, "perceiver")
def _perceiver_inputs(ctx: InputContext, generic: Callable) -> dict:
    # the bare Perceiver has no preprocessor: it cross-attends from latents to already-embedded inputs
    return {"inputs": ctx.randn(ctx.batch, ctx.size, ctx.config.d_model)}


@_for(INPUTS, "idefics")
def _idefics_inputs(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    side = ctx.config.vision_config.image_size
    ids = out["input_ids"]
    out["pixel_values"] = ctx.randn(ctx.batch, 1, 3, side, side)  # (batch, images, channels, height, width)
    out["image_attention_mask"] = torch.ones(ctx.batch, ids.shape[1], 1, dtype=torch.long)
    return out


@_for(DICT, "bros")
def _bros_bbox(d: dict, plan: Plan, **_: Any) -> None:
    # box position embeddings are projected to one attention head's width
    d.update(dim_bbox_sinusoid_emb_2d=32, dim_bbox_sinusoid_emb_1d=4, dim_bbox_projection=plan.head_dim)


@_for(DICT, "deepseek_ocr2")
def _deepseek_ocr_mlp(d: dict, plan: Plan, **_: Any) -> None:
    text = d.get("text_config", d)
    if text.get("mlp_layer_types") is None:
        text["mlp_layer_types"] = (["dense", "sparse"] * plan.layers)[: plan.layers]  # a checkpoint names them


@_for(DICT, "diffusion_gemma")
def _diffusion_gemma_experts(d: dict, plan: Plan, **_: Any) -> None:
    text = d["text_config"]
    text.update(num_experts=plan.experts, top_k_experts=2, moe_intermediate_size=plan.intermediate)


@_for(DICT, "dia")
def _dia_cross_heads(d: dict, plan: Plan, **_: Any) -> None:
    dec = d["decoder_config"]  # the cross-attention's own head fields, which the generic names miss
    dec.update(cross_head_dim=plan.head_dim, cross_num_key_value_heads=dec["cross_num_attention_heads"])


@_for(INPUTS, "dia")
def _dia_channels(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    channels = ctx.config.decoder_config.num_channels
    key = "labels" if "labels" in out else "decoder_input_ids"
    out[key] = ctx.tokens(ctx.batch, 8, channels)  # one audio codebook per channel
    return out


@_for(INPUTS, "dots3_note")
def _dots3_audio(ctx: InputContext, generic: Callable) -> dict:
    audio = ctx.config.audio_config
    frames = 64
    ctx.cache.setdefault("audio_tokens", frames // 8)  # the conv stem downsamples time 8x: one token per 8 frames
    out = generic(ctx)
    out["input_features"] = ctx.randn(ctx.batch, audio.feature_size, frames)  # (chunks, mel, time), one chunk a sample
    out["chunk_sample_lengths"] = torch.full((ctx.batch,), frames * audio.hop_length, dtype=torch.long)
    return out


def _scale_down_blocks(d: dict, keep: int = 2, detect: bool = False) -> None:
    """PP-LCNet v4 style ``block_configs`` ([kernel, in, out, stride, se] per block, per stage): the stem is scaled down,
    so the blocks must too; keep ``keep`` blocks a stage (the config derives depths and stage widths from them).
    The default is the text-recognition layout (height-only [2, 1] strides); ``detect`` makes it the detection one,
    halving both sides from the second stage on and returning all four stages to the FPN neck."""
    from .scale_down import list_width

    for value in d.values():
        if isinstance(value, dict):
            _scale_down_blocks(value, keep, detect)
    blocks = d.get("block_configs")
    if isinstance(blocks, list) and blocks and isinstance(blocks[0], list):
        d["block_configs"] = [[[b[0], list_width(b[1]), list_width(b[2]),
                                (2 if i > 0 and j == 0 else 1) if detect else b[3], *b[4:]]
                               for j, b in enumerate(stage[:keep])] for i, stage in enumerate(blocks)]
        for key in ("depths", "stage_out_channels"):
            d.pop(key, None)
        if detect:
            d.update(out_features=[f"stage{i}" for i in range(1, len(blocks) + 1)], out_indices=list(range(1, len(blocks) + 1)))


@_for(DICT, "pp_lcnet_v4", "pp_ocrv6_small_rec", "pp_ocrv6_tiny_rec")
def _lcnet_v4_blocks(d: dict, plan: Plan, **_: Any) -> None:
    _scale_down_blocks(d)


@_for(DICT, "pp_ocrv6_small_det")
def _ocr_small_det(d: dict, plan: Plan, **_: Any) -> None:
    _scale_down_blocks(d, detect=True)
    # the neck's inputs are the backbone's four stage widths
    d["layer_list_out_channels"] = [stage[-1][2] for stage in d["backbone_config"]["block_configs"]]


@_for(INPUTS, "pp_ocrv5_mobile_rec", "pp_ocrv5_server_rec", "pp_ocrv6_small_rec", "pp_ocrv6_tiny_rec")
def _ocr_rec_lines(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    # text-line crops are 48 px high; the neck pools 3 rows (the mobile default config downsamples height 32x, not 16x)
    height = 96 if ctx.model_type == "pp_ocrv5_mobile_rec" else 48
    out["pixel_values"] = ctx.randn(ctx.batch, 3, height, 64)
    return out


@_for(DICT, "pp_ocrv5_server_det", "pp_ocrv6_medium_det")
def _ocr_det_neck(d: dict, plan: Plan, **_: Any) -> None:
    """The LK-PAN neck's settings are left to the checkpoint: PaddleOCR's IntraCL block convs (kernel, stride, padding),
    the per-level upsampling back to the finest map, and the DB head kernels."""
    def conv(kh: int, kw: int) -> list:
        return [[kh, kw], 1, [kh // 2, kw // 2]]

    if d.get("intraclass_block_config") is None:
        d["intraclass_block_config"] = {
            "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
            **{f"vertical_long_to_small_conv_{r}": conv(k, 1) for r, k in (("longratio", 7), ("midratio", 5), ("shortratio", 3))},
            **{f"horizontal_small_to_long_conv_{r}": conv(1, k) for r, k in (("longratio", 7), ("midratio", 5), ("shortratio", 3))},
            **{f"symmetric_conv_long_{r}": conv(k, k) for r, k in (("longratio", 7), ("midratio", 5), ("shortratio", 3))},
        }
    d["scale_factor_list"] = d.get("scale_factor_list") or [1, 2, 4, 8]
    d["kernel_list"] = d.get("kernel_list") or [3, 2, 2]
    if d["backbone_config"].get("model_type") == "pp_lcnet_v4":  # PP-OCRv6 medium: the neck fuses all four stages
        _scale_down_blocks(d, detect=True)


@_for(CONFIG, "pp_doclayout_v2")
def _doclayout_classes(cfg: Any, plan: Plan, **_: Any) -> None:
    # per-label score thresholds and reading-order priorities, left to the checkpoint
    cfg.class_thresholds = cfg.class_thresholds or [0.5] * cfg.num_labels
    cfg.class_order = cfg.class_order or list(range(cfg.num_labels))


@_for(DICT, "pp_doclayout_v3")
def _doclayout_x4(d: dict, plan: Plan, **_: Any) -> None:
    d["x4_feat_dim"] = d["backbone_config"]["stage_out_channels"][0]  # the mask branch reads the first stage's map


@_for(INPUTS, "pp_formulanet")
def _formulanet_labels(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    if "labels" in out:  # input_ids are the target formula, shifted right into the decoder; labels align with them
        out["labels"] = out["input_ids"].clone()
    return out


@_for(DICT, "uvdoc")
def _uvdoc_bridges(d: dict, plan: Plan, **_: Any) -> None:
    n = len(d["backbone_config"]["stage_configs"])  # the head concatenates every bridge's output
    d["backbone_config"].update(out_features=[f"stage{i}" for i in range(1, n + 1)], out_indices=list(range(1, n + 1)))


@_for(INPUTS, "uvdoc")
def _uvdoc_pixels(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    out["pixel_values"] = ctx.randn(ctx.batch, 3, 64, 64)  # 16x downsampled, the 5x5 reflect-padded head needs 4x4
    return out


@_for(DICT, "qwen3_asr", "qwen3_asr_encoder")
def _qwen3_asr_windows(d: dict, plan: Plan, **_: Any) -> None:
    audio = d.get("audio_config", d)
    audio.update(n_window=50, n_window_infer=100)  # its output-length formula hard-codes 100-frame chunks (13 tokens)


@_for(INPUTS, "qwen3_asr", "qwen3_asr_encoder")
def _qwen3_asr_inputs(ctx: InputContext, generic: Callable) -> dict:
    frames = 100  # one 100-frame chunk, which the three stride-2 convs turn into 13 audio tokens
    ctx.cache.setdefault("audio_tokens", 13)
    out = generic(ctx)
    bins = out["input_features"].shape[1]
    out["input_features"] = ctx.randn(ctx.batch, bins, frames)
    out["input_features_mask"] = torch.ones(ctx.batch, frames, dtype=torch.long)
    return out


@_for(INPUTS, "fun_asr_nano", "fun_asr_nano_encoder")
def _fun_asr_lfr(ctx: InputContext, generic: Callable) -> dict:
    """Low-frame-rate features: each row stacks ``num_stacked_frames`` mel frames, (batch, time, mel x stack)."""
    from .inputs import count_features

    enc = ctx.sub("audio_config")
    frames = 64
    feats = ctx.randn(ctx.batch, frames, enc.input_size)
    mask = torch.ones(ctx.batch, frames, dtype=torch.long)
    if "audio_tokens" not in ctx.cache and ctx.model_type == "fun_asr_nano":
        ctx.cache["audio_tokens"] = count_features(ctx, "get_audio_features", {"input_features": feats, "input_features_mask": mask})
    out = generic(ctx)
    out.update(input_features=feats, input_features_mask=mask)
    return out


@_for(INPUTS, "granite_speech", "granite_speech_plus")
def _granite_speech_mask(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    if "input_features_mask" in out and ctx.cache.get("audio_tokens"):  # masks the projected audio rows, not mel frames
        out["input_features_mask"] = torch.ones(ctx.batch, ctx.cache["audio_tokens"], dtype=torch.bool)
    return out


@_for(INPUTS, "granite_speech5_ctc")
def _granite_speech5_stacked(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    audio = ctx.sub("encoder_config", "audio_config")
    frames = out["input_features"].shape[1]  # delta-expanded (x2) mel frames stacked in pairs (x2): (batch, time, 4 x mel)
    out["input_features"] = ctx.randn(ctx.batch, frames, 4 * audio.num_mel_bins)
    return out


@_for(DICT, "edgetam", "edgetam_vision_model")
def _edgetam_backbone(d: dict, plan: Plan, *, orig: dict, **_: Any) -> None:
    """EdgeTAM's image encoder is timm's RepViT-M1 (the default config misspells ``architecture``, leaving ResNet-50);
    the FPN neck lists its stage widths, deepest first."""
    _sam2_channels(d, plan)
    vision, orig_vision = d.get("vision_config", d), orig.get("vision_config", orig)
    vision["backbone_config"]["architecture"] = "repvit_m1"
    vision["backbone_channel_list"] = orig_vision["backbone_channel_list"]


@_for(DICT, "sam3_tracker")
def _sam3_tracker_sizes(d: dict, plan: Plan, **_: Any) -> None:
    vision = d["vision_config"]
    vit = vision["backbone_config"]
    grid = plan.image // vit["patch_size"]  # the ViT grid, rescaled by the FPN's scale factors 4, 2, 1
    vision["backbone_feature_sizes"] = [[int(grid * s)] * 2 for s in vision["scale_factors"][:3]]
    vit["window_size"] = grid // 2


@_for(INPUTS, "seamless_m4t", "seamless_m4t_v2")
def _seamless_speech(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    if "input_features" in out:  # speech-to-text: the speech encoder reads input_features, masked per frame
        out.pop("input_ids", None)
        out["attention_mask"] = torch.ones(out["input_features"].shape[:2], dtype=torch.long)
    return out


@_for(INPUTS, "neucodec", "xcodec2")
def _codec_semantic_features(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    semantic = ctx.config.semantic_model_config  # a Wav2Vec2-BERT encoder: (batch, time, stacked mel features)
    hop = math.prod(ctx.config.downsampling_ratios)  # one semantic frame per acoustic frame (50 Hz at 16 kHz)
    frames = out["input_values"].shape[-1] // hop
    out["input_features"] = ctx.randn(ctx.batch, frames, semantic.feature_projection_input_dim)
    out["input_features_mask"] = torch.ones(ctx.batch, frames, dtype=out["input_features_mask"].dtype)
    return out


@_for(DICT, "neucodec", "xcodec2")
def _codec_quantizer_width(d: dict, plan: Plan, **_: Any) -> None:
    d["quantization_dim"] = d["hidden_size"] + d["semantic_model_config"]["hidden_size"]  # acoustic + semantic widths


@_for(DICT, "xcodec")
def _xcodec_codebook(d: dict, plan: Plan, **_: Any) -> None:
    d["codebook_dim"] = None  # derived: the codebooks quantize the concatenated acoustic + semantic features


@_for(INPUTS, "inkling2", "inkling2_loop")
def _inkling2_patches(ctx: InputContext, generic: Callable) -> dict:
    """One (merge x patch)-square RGB block per image token, channels last; the grid counts image tokens."""
    vision = ctx.config.vision_config
    block = vision.patch_size * vision.spatial_merge_size
    grid = max(1, ctx.size // block)
    ctx.cache.setdefault("image_tokens", grid * grid)
    out = generic(ctx)
    out["pixel_values"] = ctx.randn(ctx.batch * grid * grid, block, block, vision.num_channels).clamp(-1, 1)
    out["image_grid_thw"] = torch.tensor([[1, grid, grid]] * ctx.batch)
    return out


@_for(INPUTS, "inkling_mm_model")
def _inkling_patches(ctx: InputContext, generic: Callable) -> dict:
    """Each image token is one (time, patch, patch, channels) block, folded to depth by the vision encoder."""
    vision = ctx.config.vision_config
    per_image = 4
    ctx.cache.setdefault("image_tokens", per_image)
    out = generic(ctx)
    out["pixel_values"] = ctx.randn(ctx.batch * per_image, vision.temporal_patch_size, vision.patch_size,
                                    vision.patch_size, vision.num_channels)
    return out


@_for(DICT, "informer")
def _informer_full_attention(d: dict, plan: Plan, **_: Any) -> None:
    d["attention_type"] = "full"  # ProbSparse attention samples its keys from the global RNG on every call


@_for(INPUTS, "diffusion_gemma")
def _diffusion_canvas(ctx: InputContext, generic: Callable) -> dict:
    out = generic(ctx)
    if "decoder_input_ids" not in out:  # else the canvas is drawn from the global RNG
        out["decoder_input_ids"] = ctx.tokens(ctx.batch, ctx.config.canvas_length)
    return out


@_for(INPUTS, "vibevoice_acoustic_tokenizer_encoder", "vibevoice_acoustic_tokenizer_decoder")
def _vibevoice_codec_halves(ctx: InputContext, generic: Callable) -> dict:
    """The encoder reads a waveform (batch, channels, samples); the decoder its latents (batch, hidden, frames)."""
    c, frames = ctx.config, 4
    if ctx.model_type.endswith("_encoder"):
        return {"hidden_states": ctx.randn(ctx.batch, c.channels, frames * math.prod(c.downsampling_ratios))}
    return {"hidden_states": ctx.randn(ctx.batch, c.hidden_size, frames)}


@_for(INPUTS, "mimi_decoder", "pocket_tts_audio_tokenizer_decoder")
def _codec_decoder_latents(ctx: InputContext, generic: Callable) -> dict:
    return {"latents": ctx.randn(ctx.batch, ctx.config.hidden_size, 4)}  # the encoder half's (batch, hidden, frames)


@_for(DICT, "vits")
def _vits_pad(d: dict, plan: Plan, **_: Any) -> None:
    if d.get("pad_token_id") is None or d["pad_token_id"] >= d["vocab_size"]:
        d["pad_token_id"] = 0  # the character vocabulary (38) is below the tiny one; the MMS tokenizers pad with 0
    d.update(noise_scale=0.0, noise_scale_duration=0.0)  # synthesis samples the prior and durations at these scales


@_for(DICT, "superglue")
def _superglue_descriptors(d: dict, plan: Plan, **_: Any) -> None:
    d["keypoint_detector_config"]["descriptor_decoder_dim"] = d["hidden_size"]  # SuperPoint descriptors feed the GNN
    d["gnn_layers_types"] = ["self", "cross"]  # one self/cross pair instead of nine
