"""diffusion: image and video generators from diffusers (UNets, DiTs, VAEs) at tiny sizes.

diffusers configs are constructor arguments, not config classes with
uniform size fields, so each architecture here is a spec with a hand-written
tiny configuration (32-64 channels, 1-2 layers, 2-4 heads of 8-16) and the
inputs its pipeline would feed it: noisy latents, a timestep, text
embeddings, and whatever conditioning the model requires. ``size`` is the
latent side for denoisers and the image side for autoencoders.

The loss: autoencoders reconstruct their input (MSE); denoisers regress a
target derived from the noisy input (its mirror image, so it has the noise's
distribution and the step stays deterministic); a model whose output does not
match its input's shape falls back to the mean-square reduction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..built import BuiltModel, cast_inputs, finish_model, input_generator, mean_square_loss, sgd_factory
from ..config import ModelConfig
from ..errors import ModelBuildError
from ..registry import ModelEntry, register_model

TEXT_TOKENS = 8
FRAMES = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    layers: int
    hidden: int
    heads: int

    @property
    def head_dim(self) -> int:
        return max(4, self.hidden // self.heads)


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffusionSpec:
    name: str
    class_name: str
    modality: str
    kind: str  # unet | dit | vae
    sizes: tuple[int, ...]
    kwargs: Callable[[int, Knobs], dict[str, Any]]
    inputs: Callable[[Any, int, int, Knobs], dict[str, Any]]  # (gen, batch, size, knobs)
    main: str  # the input the output reconstructs / denoises
    knobs: tuple[str, ...] = ("layers", "hidden", "heads")


def _randn(gen: Any, *shape: int) -> Any:
    import torch

    return torch.randn(*shape, generator=gen)


def _steps(gen: Any, b: int) -> Any:
    import torch

    return torch.randint(0, 1000, (b,), generator=gen)


def _text(gen: Any, b: int, dim: int = 32) -> Any:
    return _randn(gen, b, TEXT_TOKENS, dim)


def _unet_blocks(k: Knobs) -> dict[str, Any]:
    return {"block_out_channels": (k.hidden, 2 * k.hidden), "layers_per_block": k.layers, "norm_num_groups": 8}


SPECS: list[DiffusionSpec] = [
    DiffusionSpec(
        name="unet2d", class_name="UNet2DModel", modality="image", kind="unet", sizes=(16, 32), main="sample",
        kwargs=lambda s, k: {**_unet_blocks(k), "sample_size": s, "in_channels": 3, "out_channels": 3,
                             "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
                             "up_block_types": ("AttnUpBlock2D", "UpBlock2D"), "attention_head_dim": k.head_dim},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, s, s), "timestep": _steps(g, b)},
        knobs=("layers", "hidden")),
    DiffusionSpec(
        name="unet2d_condition", class_name="UNet2DConditionModel", modality="image", kind="unet", sizes=(16, 32),
        main="sample",
        kwargs=lambda s, k: {**_unet_blocks(k), "sample_size": s, "in_channels": 4, "out_channels": 4,
                             "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
                             "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "cross_attention_dim": 32,
                             "attention_head_dim": k.head_dim},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)},
        knobs=("layers", "hidden")),
    DiffusionSpec(
        name="controlnet", class_name="ControlNetModel", modality="image", kind="unet", sizes=(16, 32), main="sample",
        kwargs=lambda s, k: {**_unet_blocks(k), "in_channels": 4,
                             "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"), "cross_attention_dim": 32,
                             "attention_head_dim": k.head_dim, "conditioning_embedding_out_channels": (16, 32)},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b), "controlnet_cond": _randn(g, b, 3, 2 * s, 2 * s)},
        knobs=("layers", "hidden")),
    DiffusionSpec(
        name="dit", class_name="DiTTransformer2DModel", modality="image", kind="dit", sizes=(8, 16), main="hidden_states",
        kwargs=lambda s, k: {"num_attention_heads": k.heads, "attention_head_dim": k.head_dim, "in_channels": 4,
                             "num_layers": k.layers, "sample_size": s, "patch_size": 2, "num_embeds_ada_norm": 1000},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "class_labels": _steps(g, b)}),
    DiffusionSpec(
        name="pixart", class_name="PixArtTransformer2DModel", modality="image", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"num_attention_heads": k.heads, "attention_head_dim": k.head_dim, "in_channels": 4,
                             "out_channels": 4, "num_layers": k.layers, "cross_attention_dim": k.heads * k.head_dim,
                             "caption_channels": 32, "sample_size": s, "patch_size": 2},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b),
                                   "added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}),
    DiffusionSpec(
        name="sd3_mmdit", class_name="SD3Transformer2DModel", modality="image", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"sample_size": s, "patch_size": 2, "in_channels": 4, "out_channels": 4,
                             "num_layers": k.layers, "attention_head_dim": k.head_dim, "num_attention_heads": k.heads,
                             "joint_attention_dim": 32, "caption_projection_dim": k.heads * k.head_dim,
                             "pooled_projection_dim": 16, "pos_embed_max_size": 16},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b), "pooled_projections": _randn(g, b, 16)}),
    DiffusionSpec(
        name="flux", class_name="FluxTransformer2DModel", modality="image", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"patch_size": 1, "in_channels": 16, "num_layers": k.layers, "num_single_layers": k.layers,
                             "attention_head_dim": 16, "num_attention_heads": k.heads, "joint_attention_dim": 32,
                             "pooled_projection_dim": 16, "axes_dims_rope": (4, 6, 6)},
        inputs=lambda g, b, s, k: _flux_inputs(g, b, s),
        knobs=("layers", "heads")),
    DiffusionSpec(
        name="sana", class_name="SanaTransformer2DModel", modality="image", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"in_channels": 4, "out_channels": 4, "num_attention_heads": k.heads,
                             "attention_head_dim": k.head_dim, "num_layers": k.layers,
                             "num_cross_attention_heads": k.heads, "cross_attention_head_dim": k.head_dim,
                             "cross_attention_dim": k.heads * k.head_dim, "caption_channels": 32, "sample_size": s,
                             "patch_size": 1},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)}),
    DiffusionSpec(
        name="vae_kl", class_name="AutoencoderKL", modality="image", kind="vae", sizes=(32, 64), main="sample",
        kwargs=lambda s, k: {"block_out_channels": (k.hidden, 2 * k.hidden), "layers_per_block": k.layers,
                             "down_block_types": ("DownEncoderBlock2D",) * 2, "up_block_types": ("UpDecoderBlock2D",) * 2,
                             "latent_channels": 4, "norm_num_groups": 8, "sample_size": s},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, s, s)}, knobs=("layers", "hidden")),
    DiffusionSpec(
        name="vq", class_name="VQModel", modality="image", kind="vae", sizes=(32, 64), main="sample",
        kwargs=lambda s, k: {"block_out_channels": (k.hidden, 2 * k.hidden), "layers_per_block": k.layers,
                             "down_block_types": ("DownEncoderBlock2D",) * 2, "up_block_types": ("UpDecoderBlock2D",) * 2,
                             "latent_channels": 3, "num_vq_embeddings": 32, "norm_num_groups": 8, "sample_size": s},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, s, s)}, knobs=("layers", "hidden")),
    DiffusionSpec(
        name="vae_tiny", class_name="AutoencoderTiny", modality="image", kind="vae", sizes=(32, 64), main="sample",
        kwargs=lambda s, k: {"encoder_block_out_channels": (k.hidden // 2,) * 4,
                             "decoder_block_out_channels": (k.hidden // 2,) * 4,
                             "num_encoder_blocks": (1,) + (k.layers,) * 3, "num_decoder_blocks": (k.layers,) * 3 + (1,)},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, s, s)}, knobs=("layers", "hidden")),
    DiffusionSpec(
        name="unet3d_condition", class_name="UNet3DConditionModel", modality="video", kind="unet", sizes=(16, 32),
        main="sample",
        kwargs=lambda s, k: {**_unet_blocks(k), "sample_size": s, "in_channels": 4, "out_channels": 4,
                             "down_block_types": ("CrossAttnDownBlock3D", "DownBlock3D"),
                             "up_block_types": ("UpBlock3D", "CrossAttnUpBlock3D"), "cross_attention_dim": 32,
                             "attention_head_dim": k.head_dim},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 4, FRAMES, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)},
        knobs=("layers", "hidden")),
    DiffusionSpec(
        name="unet_spatio_temporal", class_name="UNetSpatioTemporalConditionModel", modality="video", kind="unet",
        sizes=(16, 32), main="sample",
        kwargs=lambda s, k: {"block_out_channels": (k.hidden, 2 * k.hidden), "layers_per_block": k.layers,
                             "sample_size": s, "in_channels": 8, "out_channels": 4,
                             "down_block_types": ("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
                             "up_block_types": ("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
                             "cross_attention_dim": 32, "num_attention_heads": (2, 4), "addition_time_embed_dim": 8,
                             "projection_class_embeddings_input_dim": 24, "num_frames": FRAMES},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, FRAMES, 8, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _randn(g, b, 1, 32), "added_time_ids": _randn(g, b, 3)},
        knobs=("layers", "hidden")),
    DiffusionSpec(
        name="cogvideox", class_name="CogVideoXTransformer3DModel", modality="video", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"num_attention_heads": k.heads, "attention_head_dim": k.head_dim, "in_channels": 4,
                             "out_channels": 4, "time_embed_dim": 32, "text_embed_dim": 32, "num_layers": k.layers,
                             "sample_width": s, "sample_height": s, "sample_frames": 4 * (FRAMES - 1) + 1,
                             "patch_size": 2, "temporal_compression_ratio": 4, "max_text_seq_length": TEXT_TOKENS},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, FRAMES, 4, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)}),
    DiffusionSpec(
        name="ltx_video", class_name="LTXVideoTransformer3DModel", modality="video", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"in_channels": 8, "out_channels": 8, "num_attention_heads": k.heads,
                             "attention_head_dim": k.head_dim, "cross_attention_dim": k.heads * k.head_dim,
                             "num_layers": k.layers, "caption_channels": 32},
        inputs=lambda g, b, s, k: _ltx_inputs(g, b, s)),
    DiffusionSpec(
        name="wan", class_name="WanTransformer3DModel", modality="video", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"patch_size": (1, 2, 2), "num_attention_heads": k.heads, "attention_head_dim": k.head_dim,
                             "in_channels": 4, "out_channels": 4, "text_dim": 32, "freq_dim": 32, "ffn_dim": 2 * k.hidden,
                             "num_layers": k.layers, "rope_max_seq_len": 32},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, FRAMES, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)}),
    DiffusionSpec(
        name="latte", class_name="LatteTransformer3DModel", modality="video", kind="dit", sizes=(8, 16),
        main="hidden_states",
        kwargs=lambda s, k: {"num_attention_heads": k.heads, "attention_head_dim": k.head_dim, "in_channels": 4,
                             "out_channels": 4, "num_layers": k.layers, "cross_attention_dim": k.heads * k.head_dim,
                             "sample_size": s, "patch_size": 2, "num_embeds_ada_norm": 1000,
                             "norm_type": "ada_norm_single", "caption_channels": 32, "video_length": FRAMES},
        inputs=lambda g, b, s, k: {"hidden_states": _randn(g, b, 4, FRAMES, s, s), "timestep": _steps(g, b),
                                   "encoder_hidden_states": _text(g, b)}),
    DiffusionSpec(
        name="vae_kl_temporal_decoder", class_name="AutoencoderKLTemporalDecoder", modality="video", kind="vae",
        sizes=(32, 64), main="sample",
        kwargs=lambda s, k: {"block_out_channels": (k.hidden, 2 * k.hidden), "layers_per_block": k.layers,
                             "down_block_types": ("DownEncoderBlock2D",) * 2, "latent_channels": 4, "sample_size": s},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, s, s), "num_frames": b}, knobs=("layers", "hidden")),
    DiffusionSpec(
        name="vae_wan", class_name="AutoencoderKLWan", modality="video", kind="vae", sizes=(32, 64), main="sample",
        kwargs=lambda s, k: {"base_dim": k.hidden // 2, "z_dim": 4, "dim_mult": [1, 2], "num_res_blocks": k.layers,
                             "temperal_downsample": [False], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4,
                             "scale_factor_spatial": 2},
        inputs=lambda g, b, s, k: {"sample": _randn(g, b, 3, 1, s, s)}, knobs=("layers", "hidden")),
]


def _flux_inputs(gen: Any, b: int, s: int) -> dict[str, Any]:
    import torch

    n = s * s // 4
    side = max(1, int(n**0.5))
    img_ids = torch.zeros(n, 3)
    img_ids[:, 1] = torch.arange(n) // side
    img_ids[:, 2] = torch.arange(n) % side
    return {"hidden_states": _randn(gen, b, n, 16), "encoder_hidden_states": _text(gen, b),
            "pooled_projections": _randn(gen, b, 16), "timestep": torch.rand(b, generator=gen),
            "img_ids": img_ids, "txt_ids": torch.zeros(TEXT_TOKENS, 3)}


def _ltx_inputs(gen: Any, b: int, s: int) -> dict[str, Any]:
    import torch

    return {"hidden_states": _randn(gen, b, FRAMES * s * s, 8), "encoder_hidden_states": _text(gen, b),
            "timestep": _steps(gen, b), "encoder_attention_mask": torch.ones(b, TEXT_TOKENS),
            "num_frames": FRAMES, "height": s, "width": s}


def _make_builder(spec: DiffusionSpec) -> Callable[[ModelConfig, ModelEntry], BuiltModel]:
    def build(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
        import diffusers
        import torch

        diffusers.logging.set_verbosity_error()  # the float32-modules warning on .to(dtype) is expected here
        knobs = Knobs(layers=config.layers or (1 if spec.kind != "dit" else 2), hidden=config.hidden or 32,
                      heads=config.heads or 2)
        cls = getattr(diffusers, spec.class_name, None)
        if cls is None:
            raise ModelBuildError(f"{entry.name}: diffusers has no {spec.class_name}")
        model = finish_model(cls(**spec.kwargs(config.size, knobs)), config)
        dtype = next(p.dtype for p in model.parameters())

        def batch(step: int) -> dict[str, Any]:
            gen = input_generator(config, step)
            return cast_inputs(spec.inputs(gen, config.batch, config.size, knobs), dtype)

        def loss_fn(outputs: Any, inputs: dict[str, Any]) -> torch.Tensor:
            out = getattr(outputs, "sample", None)
            if out is None and isinstance(outputs, (tuple, list)) and outputs:
                out = outputs[0]
            ref = inputs.get(spec.main)
            if isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor) and out.shape == ref.shape:
                target = ref if spec.kind == "vae" else ref.flip(-1)
                return torch.nn.functional.mse_loss(out.float(), target.float())
            return mean_square_loss(outputs)

        return BuiltModel(model=model, inputs=batch(0), loss_fn=loss_fn, optimizer_factory=sgd_factory,
                          modality=spec.modality, notes=f"diffusers {spec.class_name} ({spec.kind})", config=config,
                          batch_fn=batch)

    return build


for _spec in SPECS:
    register_model(
        f"diffusion/{_spec.name}", modality=_spec.modality, tasks=("generation",),
        sizes=_spec.sizes, batches=(2, 1),
        knob_values={k: v for k, v in {"layers": (2, 3) if _spec.kind == "dit" else (2,), "hidden": (64,),
                                       "heads": (4,)}.items() if k in _spec.knobs},
        meta={"class_name": _spec.class_name, "kind": _spec.kind},
    )(_make_builder(_spec))
