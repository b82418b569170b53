"""Inputs for a transformers model, from its forward signature and its (tiny) config.

Each modality gets what its processor would produce: token ids that avoid
every special id (an image placeholder drawn at random would change how many
image features the model expects), pixel values at the config's image size,
log-mel features or raw waveforms long enough for the feature encoder, video
frames, time-series windows. Task heads get labels in the form their loss
reads, so ``outputs.loss`` is the model's own loss. Family-specific inputs
live in ``fixups.INPUTS``; this module holds the generic rules.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from .scale_down import SPECIAL_SPAN

TEXT_LEN_DEFAULT = 16
LM_TASKS = {"causal_lm", "masked_lm", "image_text_to_text", "multimodal_lm", "causal_image_modeling", "pretraining",
            "vision2seq", "conditional_generation"}
SEQ2SEQ_TASKS = {"seq_to_seq_causal_lm", "speech_seq_2_seq", "text_to_spectrogram", "text_to_waveform"}
CLASS_TASKS = {"sequence_classification", "image_classification", "audio_classification", "video_classification",
               "audio_xvector", "multiple_choice", "next_sentence_prediction", "time_series_classification"}


@dataclass(slots=True, kw_only=True)
class InputContext:
    """What an input rule may read: the model, its config, the task, sizes and a private generator."""

    model: torch.nn.Module
    config: Any
    task: str
    model_type: str
    batch: int
    size: int
    modality: str
    gen: torch.Generator
    params: dict[str, inspect.Parameter] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)

    def accepts(self, name: str) -> bool:
        return name in self.params or any(p.kind == p.VAR_KEYWORD for p in self.params.values()) and name in KWARGS_OK

    @property
    def text_config(self) -> Any:
        try:
            return self.config.get_text_config(decoder=True)
        except Exception:  # noqa: BLE001 - configs without a text part
            return self.config

    def sub(self, *names: str) -> Any:
        """The first sub-config among ``names`` (``vision_config`` ...), else the config itself."""
        for name in names:
            value = getattr(self.config, name, None)
            if value is not None and not isinstance(value, (int, str, float, bool, dict, list)):
                return value
        return self.config

    def randint(self, high: int, shape: tuple[int, ...], low: int = 0) -> torch.Tensor:
        return torch.randint(low, max(low + 1, high), shape, generator=self.gen)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def tokens(self, *shape: int) -> torch.Tensor:
        """Token ids drawn from the ordinary part of the vocabulary (no special id)."""
        allowed = self.cache.get("allowed")
        if allowed is None:
            allowed = self.cache["allowed"] = allowed_tokens(self.config, self.vocab_size())
        idx = torch.randint(0, len(allowed), shape, generator=self.gen)
        return allowed[idx]

    def vocab_size(self) -> int:
        v = getattr(self.text_config, "vocab_size", None) or getattr(self.config, "vocab_size", None)
        return int(v) if isinstance(v, int) and v > 0 else 256

    def num_labels(self) -> int:
        n = getattr(self.config, "num_labels", 2)
        return int(n) if isinstance(n, int) and n > 0 else 2


KWARGS_OK = {"attention_mask", "labels", "pixel_values", "input_ids"}


def special_ids(config: Any) -> set[int]:
    """Every token id a config names (``*_token_id``, ``*_token_index``, lists of them), nested configs included."""
    found: set[int] = set()

    def walk(d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                lk = str(k).lower()
                if isinstance(v, dict):
                    walk(v)
                elif ("token" in lk and ("id" in lk or "index" in lk)) or lk in ("pad_token_id", "bos_token_id", "eos_token_id"):
                    if isinstance(v, int) and not isinstance(v, bool):
                        found.add(v)
                    elif isinstance(v, (list, tuple)):
                        found.update(x for x in v if isinstance(x, int) and not isinstance(x, bool))

    try:
        walk(config.to_dict())
    except Exception:  # noqa: BLE001 - a config whose to_dict fails; use attributes
        walk({k: v for k, v in vars(config).items()})
    return found


def allowed_tokens(config: Any, vocab: int) -> torch.Tensor:
    """Ids below the special span and not named by the config; at least a handful."""
    specials = special_ids(config)
    top = max(8, vocab - SPECIAL_SPAN) if vocab > 2 * SPECIAL_SPAN else vocab
    ids = [i for i in range(4, top) if i not in specials]
    if len(ids) < 4:
        ids = [i for i in range(vocab) if i not in specials] or list(range(vocab))
    return torch.tensor(ids, dtype=torch.long)


def signature_params(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}


def image_geometry(ctx: InputContext) -> tuple[int, int]:
    """(channels, side) of the image the vision part expects."""
    vision = ctx.sub("vision_config", "backbone_config", "encoder_config", "image_config", "vision_tower_config")
    channels = getattr(vision, "num_channels", None) or getattr(vision, "in_channels", None) or getattr(ctx.config, "num_channels", None) or 3
    side = getattr(vision, "image_size", None) or getattr(ctx.config, "image_size", None) or ctx.size
    if isinstance(side, (list, tuple)):
        side = side[0]
    if isinstance(side, dict):
        side = side.get("height", ctx.size)
    return int(channels), int(side)


def generic_inputs(ctx: InputContext) -> dict[str, Any]:
    """Inputs for the common cases; ``fixups.INPUTS`` adjusts per family."""
    p = ctx.params
    out: dict[str, Any] = {}
    b = ctx.batch
    ctx.modality = effective_modality(ctx)
    text_len = ctx.size if ctx.modality in ("text", "other") else TEXT_LEN_DEFAULT
    has_text = "input_ids" in p and ctx.modality not in ("image", "audio", "video", "time_series")
    if "past_values" in p:
        out.update(time_series_inputs(ctx))
    grid_key = next((k for k in ("image_grid_thw", "image_grid_hw", "target_sizes") if k in p), None)
    if grid_key and "pixel_values" in p and ctx.modality in ("image+text", "image"):
        out.update(grid_vision_inputs(ctx, grid_key))
    elif "spatial_shapes" in p and "pixel_values" in p:
        out.update(naflex_inputs(ctx))
    elif "pixel_values" in p and ctx.modality in ("image", "image+text", "video", "video+text", "other"):
        channels, side = image_geometry(ctx)
        if getattr(ctx.config, "image_grid_pinpoints", None) and "image_sizes" in p:
            out["pixel_values"] = ctx.randn(b, 2, channels, side, side)  # any-res: base view + one tile
        elif "pixel_attention_mask" in p:  # Idefics-style: (batch, images, channels, height, width) plus a pixel mask
            out["pixel_values"] = ctx.randn(b, 1, channels, side, side)
            out["pixel_attention_mask"] = torch.ones(b, 1, side, side, dtype=torch.long)
        elif ctx.modality.startswith("video") or isinstance(_find_attr(ctx.config, ("num_frames",)), int) \
                or ctx.model_type in FIVE_D_PIXELS:
            frames = 1 if ctx.model_type in FIVE_D_PIXELS else int(_find_attr(ctx.config, ("num_frames",)) or 4)
            out["pixel_values"] = ctx.randn(b, frames, channels, side, side)
        else:
            out["pixel_values"] = ctx.randn(b, channels, side, side)
    elif "pixel_values_videos" in p and ctx.modality.startswith("video"):
        channels, side = image_geometry(ctx)
        frames = int(getattr(ctx.config, "num_frames", None) or 4)
        out["pixel_values_videos"] = ctx.randn(b, frames, channels, side, side)
    if "input_values" in p and ctx.modality.startswith("audio"):
        if is_codec(ctx.config):
            channels = int(getattr(ctx.config, "audio_channels", None) or 1)
            out["input_values"] = ctx.randn(b, channels, waveform_length(ctx))
        else:
            out["input_values"] = ctx.randn(b, waveform_length(ctx))
    if "input_features" in p and ctx.modality.startswith("audio") and not ("input_values" in out and _find_attr(ctx.config, ("conv_kernel",))):
        bins, frames = mel_geometry(ctx)
        features = ctx.randn(b, bins, frames)
        out["input_features"] = features if mel_channels_first(ctx, bins) else features.transpose(1, 2).contiguous()
        for name in AUDIO_MASKS:
            if name in p:  # Gemma 3n-style "input_features_mask" is boolean, attention masks are integer
                out[name] = torch.ones(b, frames, dtype=torch.bool if name == "input_features_mask" else torch.long)
    if "image_sizes" in p and "pixel_values" in out and ctx.modality == "image+text" \
            and (getattr(ctx.config, "image_grid_pinpoints", None) or ctx.model_type in NEEDS_IMAGE_SIZES):
        side = out["pixel_values"].shape[-1]  # before the text: counting image tokens needs it
        out["image_sizes"] = torch.tensor([[side, side]] * b)
    if has_text or ("input_ids" in p and not out):
        if "pixel_values" in out and ctx.modality == "image+text":
            out["input_ids"] = with_image_tokens(ctx, out, text_len)
        elif ({"input_features", "input_values"} & set(out)) and ctx.modality == "audio+text" \
                and audio_token_id(ctx.config) is not None:
            out["input_ids"] = with_audio_tokens(ctx, out, text_len)
        else:
            out["input_ids"] = ctx.tokens(b, text_len)
        if "attention_mask" in p:
            out["attention_mask"] = torch.ones_like(out["input_ids"])
        if "mm_token_type_ids" in p and image_token_id(ctx.config) is not None:
            out["mm_token_type_ids"] = (out["input_ids"] == image_token_id(ctx.config)).int()
    if getattr(ctx.config, "is_encoder_decoder", False) and "decoder_input_ids" in p and ctx.task not in SEQ2SEQ_TASKS | LM_TASKS:
        # as long as the encoder input: QA and classification heads read decoder states at input positions
        out["decoder_input_ids"] = out["input_ids"].clone() if "input_ids" in out else ctx.tokens(b, 8)
    extra_inputs(ctx, out)
    out.update(labels_for(ctx, out))
    return out


def effective_modality(ctx: InputContext) -> str:
    """The catalog's modality, less the towers this config does not have (Gemma 4 without an audio_config)."""
    m = ctx.modality
    no_audio = hasattr(ctx.config, "audio_config") and ctx.config.audio_config is None
    no_vision = hasattr(ctx.config, "vision_config") and ctx.config.vision_config is None
    if ctx.model_type in TEXT_ONLY:
        return "text"
    if m == "audio+text" and no_audio:
        m = "image+text" if "pixel_values" in ctx.params and not no_vision else "text"
    if m == "image+text" and no_vision:
        m = "text"
    return m


def extra_inputs(ctx: InputContext, out: dict[str, Any]) -> None:
    """Inputs that ride along with the main ones when the forward asks for them."""
    p, b = ctx.params, ctx.batch
    ids = out.get("input_ids")
    if "qformer_input_ids" in p:
        out["qformer_input_ids"] = ctx.tokens(b, 8)
        if "qformer_attention_mask" in p:
            out["qformer_attention_mask"] = torch.ones(b, 8, dtype=torch.long)
    if "bbox" in p and ids is not None and ids.ndim == 2:
        dim = int(getattr(ctx.config, "dim_bbox", 4) or 4)
        corners = torch.sort(ctx.randint(1000, (b, ids.shape[1], dim)), dim=-1).values
        out["bbox"] = corners.float() / 1000 if hasattr(ctx.config, "dim_bbox") else corners


def labels_for(ctx: InputContext, inputs: dict[str, Any]) -> dict[str, Any]:
    p, b, task = ctx.params, ctx.batch, ctx.task
    out: dict[str, Any] = {}
    ids = inputs.get("input_ids")
    if task in ("multiple_choice",) and ids is not None:
        choices = 2
        inputs["input_ids"] = ids.unsqueeze(1).expand(b, choices, ids.shape[-1]).contiguous()
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        if "labels" in p:
            out["labels"] = ctx.randint(choices, (b,))
        return out
    if "labels" not in p:
        if task == "question_answering" and "start_positions" in p and ids is not None:
            out["start_positions"] = ctx.randint(ids.shape[-1], (b,))
            out["end_positions"] = ctx.randint(ids.shape[-1], (b,))
        return out
    if getattr(ctx.config, "is_encoder_decoder", False) and task in LM_TASKS | SEQ2SEQ_TASKS:
        out["labels"] = ctx.tokens(b, 8)  # the model shifts labels right into decoder inputs
    elif task in LM_TASKS and ids is not None and ctx.modality in ("text", "image+text", "video+text", "audio+text"):
        labels = ids.clone()
        allowed = ctx.cache.get("allowed")
        if allowed is not None:  # placeholders (image tokens ...) are not predicted
            labels[~torch.isin(labels, allowed)] = -100
        out["labels"] = labels
        if task == "pretraining" and "next_sentence_label" in p:
            out["next_sentence_label"] = ctx.randint(2, (b,))
    elif task in SEQ2SEQ_TASKS:
        out["labels"] = ctx.tokens(b, 8)
    elif task == "next_sentence_prediction":
        out["labels"] = ctx.randint(2, (b,))
    elif task in CLASS_TASKS:
        out["labels"] = ctx.randint(ctx.num_labels(), (b,))
        eos = getattr(ctx.text_config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        if task == "sequence_classification" and ids is not None and isinstance(eos, int) and ids.ndim == 2:
            ids[:, -1] = eos  # encoder-decoder classifiers pool at the (single) end-of-sequence token
            for name in ("decoder_input_ids",):
                if name in inputs:
                    inputs[name][:, -1] = eos
    elif task == "token_classification" and ids is not None:
        out["labels"] = ctx.randint(ctx.num_labels(), tuple(ids.shape))
    elif task == "ctc":
        vocab = ctx.vocab_size()
        out["labels"] = ctx.randint(vocab, (b, 2), low=1 if vocab > 1 else 0)
    elif task == "semantic_segmentation" and "pixel_values" in inputs:
        side = inputs["pixel_values"].shape[-1]
        out["labels"] = ctx.randint(ctx.num_labels(), (b, side, side))
    return out


AUDIO_MASKS = ("feature_attention_mask", "input_features_mask", "audio_attention_mask", "input_features_attention_mask",
               "audio_feature_mask", "input_features_lengths_mask")
# Families whose feature encoder starts with a Conv1d over mel bins but reads (batch, time, mel) and transposes.
TIME_FIRST = {"speech_to_text", "speech_to_text_2", "univnet"}
# Families that read (batch, mel, time) into a Conv2d stem (Qwen3-ASR chunks the time axis), not found by the Conv1d test.
MEL_FIRST = {"qwen3_asr", "qwen3_asr_encoder"}
# Multimodal models run on text alone: Gemma 3n's audio tokens index an embedder past the text vocabulary
# and its vision tower is a full-size timm MobileNetV5 with a fixed token grid, neither of which scales down.
TEXT_ONLY = {"gemma3n"}
# Grid-style vision inputs whose patches stay (channels, patch, patch) images.
PATCH_IMAGES = {"kimi_k25", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7"}
# Image-text models whose forward needs each image's size (any-resolution ones are found by their pinpoints).
NEEDS_IMAGE_SIZES = {"mistral3", "lighton_ocr", "pixtral", "granite4_vision"}
# Image-text models that take (batch, images, channels, height, width) without a pixel mask.
FIVE_D_PIXELS = {"colmodernvbert", "modernvbert", "instructblipvideo", "granite_docling"}


# Families that read raw waveforms as (batch, 1, samples) without a codec-style config.
CHANNEL_WAVEFORMS = {"omniasr", "omniasr_ctc", "omniasr_audio"}


def is_codec(config: Any) -> bool:
    """Neural audio codecs (EnCodec, DAC, Mimi ...) read waveforms as (batch, channels, samples)."""
    return getattr(config, "model_type", None) in CHANNEL_WAVEFORMS or \
        _find_attr(config, ("audio_channels", "downsampling_ratios", "upsampling_ratios")) is not None


def mel_channels_first(ctx: InputContext, bins: int) -> bool:
    """Whether features are (batch, mel, time): the encoder opens with a Conv1d over the mel bins (Whisper-style)."""
    if ctx.model_type in TIME_FIRST:
        return False
    if ctx.model_type in MEL_FIRST:
        return True
    return any(isinstance(m, torch.nn.Conv1d) and m.in_channels == bins for m in ctx.model.modules())


def audio_token_id(config: Any) -> int | None:
    for name in ("audio_token_id", "audio_token_index", "audio_pad_token_id", "speech_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def with_audio_tokens(ctx: InputContext, inputs: dict[str, Any], text_len: int) -> torch.Tensor:
    """Token ids with the audio placeholders first, as many as the audio encoder produces."""
    if "audio_tokens" not in ctx.cache:
        ctx.cache["audio_tokens"] = count_features(
            ctx, "get_audio_features", {k: v for k, v in inputs.items() if k in ("input_features", "input_values") or k in AUDIO_MASKS})
    audio = inputs.get("input_features", inputs.get("input_values"))
    n = ctx.cache["audio_tokens"] or max(1, audio.shape[-1] // 4)
    placeholders = torch.full((ctx.batch, n), audio_token_id(ctx.config), dtype=torch.long)
    return torch.cat([placeholders, ctx.tokens(ctx.batch, text_len)], dim=1)


def waveform_length(ctx: InputContext) -> int:
    """Samples for ``ctx.size`` frames through the conv feature encoder (wav2vec2-style), else 16 per frame."""
    kernels = getattr(ctx.config, "conv_kernel", None)
    strides = getattr(ctx.config, "conv_stride", None)
    if isinstance(kernels, (list, tuple)) and isinstance(strides, (list, tuple)) and kernels:
        length = 1
        for k, s in zip(reversed(kernels), reversed(strides)):
            length = (length - 1) * s + k
        total_stride = 1
        for s in strides:
            total_stride *= s
        return int(length + total_stride * (ctx.size - 1))
    ratios = _find_attr(ctx.config, ("downsampling_ratios", "upsampling_ratios"))
    if isinstance(ratios, (list, tuple)) and ratios:
        hop = 1
        for r in ratios:
            hop *= int(r)
        return int(hop * ctx.size)
    return 100 * ctx.size


def _find_attr(config: Any, names: tuple[str, ...], depth: int = 0) -> Any:
    """The first of ``names`` on the config or (one level down) its sub-configs."""
    for name in names:
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    if depth < 2:
        for value in vars(config).values():
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                found = _find_attr(value, names, depth + 1)
                if found is not None:
                    return found
    return None


def mel_geometry(ctx: InputContext) -> tuple[int, int]:
    """(mel bins, frames) for ``input_features``."""
    audio = ctx.sub("audio_config", "encoder_config", "speech_config")
    bins = None
    for name in ("feature_projection_input_dim", "num_mel_bins", "input_feat_size", "feature_size", "input_feat_per_channel", "n_mels", "mel_bins", "input_dim", "num_mel_filters"):
        for owner in (audio, ctx.config):
            value = getattr(owner, name, None)
            if isinstance(value, int) and value > 0:
                bins = value
                break
        if bins:
            break
    frames = 4 * ctx.size
    bins = int(bins or 80)
    for owner in (audio, ctx.config):
        max_source = getattr(owner, "max_source_positions", None)
        if isinstance(max_source, int) and mel_channels_first(ctx, bins):
            frames = 2 * max_source  # Whisper-style encoders take exactly 2 x max_source_positions frames
            break
    return bins, frames


def time_series_inputs(ctx: InputContext) -> dict[str, Any]:
    """Past (and future) values for the time-series models, with their time features and masks."""
    c, p, b = ctx.config, ctx.params, ctx.batch
    context = getattr(c, "context_length", None) or ctx.size
    lags = getattr(c, "lags_sequence", None) or [0]
    past_len = int(context + max(lags))
    channels = getattr(c, "num_input_channels", None) or getattr(c, "input_size", None) or 1
    shape = (b, past_len) if channels == 1 and "num_input_channels" not in vars(c) else (b, past_len, channels)
    out: dict[str, Any] = {"past_values": ctx.randn(*shape)}
    n_time = int(getattr(c, "num_time_features", 0) or 0) or 1
    if "past_time_features" in p:
        out["past_time_features"] = ctx.randn(b, past_len, n_time)
    if "past_observed_mask" in p:
        out["past_observed_mask"] = torch.ones(shape)
    pred = getattr(c, "prediction_length", None)
    if pred and "future_values" in p:
        fshape = (b, pred) if len(shape) == 2 else (b, pred, channels)
        out["future_values"] = ctx.randn(*fshape)
        if "future_time_features" in p:
            out["future_time_features"] = ctx.randn(b, pred, n_time)
    return out


def count_image_features(ctx: InputContext, inputs: dict[str, Any]) -> int | None:
    """How many placeholder tokens the images need, from the model's own ``get_image_features``."""
    return count_features(ctx, "get_image_features",
                          {k: v for k, v in inputs.items() if k.startswith(("pixel", "image", "spatial_shapes", "target_sizes"))})


def count_features(ctx: InputContext, method: str, kwargs: dict[str, Any]) -> int | None:
    """Placeholder tokens per sample: the features ``model.<method>(**kwargs)`` returns, in text-width rows."""
    fn = getattr(ctx.model, method, None)
    if fn is None:  # wrappers (ColPali around PaliGemma) keep the method on an inner model
        fn = next((getattr(m, method) for m in ctx.model.modules() if m is not ctx.model and hasattr(m, method)), None)
    if fn is None:
        return None
    hidden = getattr(ctx.text_config, "hidden_size", None)
    try:
        with torch.no_grad():
            feats = fn(**kwargs)
    except Exception:  # noqa: BLE001 - fall back to the config's count
        return None
    if hasattr(feats, "pooler_output") and feats.pooler_output is not None:
        feats = feats.pooler_output
    elif hasattr(feats, "last_hidden_state"):
        feats = feats.last_hidden_state
    tensors = [feats] if isinstance(feats, torch.Tensor) else [t for t in (feats if isinstance(feats, (list, tuple)) else []) if isinstance(t, torch.Tensor)]
    if not tensors or not hidden:
        return None
    total = sum(t.numel() for t in tensors) // hidden
    return max(1, total // ctx.batch)


def image_token_id(config: Any) -> int | None:
    value = _find_attr(config, ("image_token_id", "image_token_index", "img_token_id"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def grid_vision_inputs(ctx: InputContext, grid_key: str = "image_grid_thw") -> dict[str, Any]:
    """Qwen2-VL style vision input: flattened patches plus a (t, h, w) or (h, w) grid per image."""
    vision = ctx.sub("vision_config", "vision_tower_config")
    patch = int(_first_int(vision, ("patch_size", "spatial_patch_size")) or 8)
    temporal = int(_first_int(vision, ("temporal_patch_size",)) or 1)
    merge = int(_first_int(vision, ("spatial_merge_size", "merge_size")) or 1)
    channels = int(_first_int(vision, ("in_channels", "num_channels", "in_chans")) or 3)
    side = int(_first_int(vision, ("image_size",)) or 32)
    grid = max(merge, (side // patch) // merge * merge)
    ctx.cache["grid_tokens"] = grid * grid // (merge * merge)
    pixels = ctx.randn(ctx.batch * grid * grid, channels * temporal * patch * patch)
    if ctx.model_type in PATCH_IMAGES:  # patches kept as little images for a conv stem
        pixels = pixels.view(-1, channels, temporal * patch, patch)
    if grid_key == "image_grid_thw":
        return {"pixel_values": pixels, grid_key: torch.tensor([[1, grid, grid]] * ctx.batch)}
    return {"pixel_values": pixels, grid_key: torch.tensor([[grid, grid]] * ctx.batch)}


def naflex_inputs(ctx: InputContext) -> dict[str, Any]:
    """SigLIP2 (NaFlex) style vision input: patch rows, a patch mask and each image's patch grid."""
    vision = ctx.sub("vision_config")
    patch = int(_first_int(vision, ("patch_size",)) or 8)
    channels = int(_first_int(vision, ("num_channels", "in_channels")) or 3)
    patches = int(_first_int(vision, ("num_patches",)) or 16)
    grid = max(1, int(patches ** 0.5))
    return {"pixel_values": ctx.randn(ctx.batch, grid * grid, channels * patch * patch),
            "pixel_attention_mask": torch.ones(ctx.batch, grid * grid, dtype=torch.long),
            "spatial_shapes": torch.tensor([[grid, grid]] * ctx.batch)}


def _first_int(owner: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(owner, name, None)
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def with_image_tokens(ctx: InputContext, inputs: dict[str, Any], text_len: int) -> torch.Tensor:
    """Token ids with each sample's image placeholders first (inside vision start/end markers), then text."""
    token = image_token_id(ctx.config)
    if token is None:
        return ctx.tokens(ctx.batch, text_len)
    if "image_tokens" not in ctx.cache:
        ctx.cache["image_tokens"] = count_image_features(ctx, inputs) or ctx.cache.get("grid_tokens")
    n = ctx.cache["image_tokens"]
    if n is None:
        for name in ("image_seq_length", "num_image_tokens", "mm_tokens_per_image", "image_seq_len", "num_query_tokens"):
            value = getattr(ctx.config, name, None)
            if isinstance(value, int) and value > 0:
                n = value
                break
    n = n or 1
    ids = ctx.tokens(ctx.batch, text_len)
    parts = []
    start = _first_int(ctx.config, ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index"))
    end = _first_int(ctx.config, ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index"))
    if start is not None:
        parts.append(torch.full((ctx.batch, 1), start, dtype=torch.long))
    parts.append(torch.full((ctx.batch, n), token, dtype=torch.long))
    if end is not None:
        parts.append(torch.full((ctx.batch, 1), end, dtype=torch.long))
    return torch.cat(parts + [ids], dim=1)
