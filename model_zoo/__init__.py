"""The model zoo: a registry of architectures, their configuration space, and builders.

    from model_zoo import ModelConfig, build, registry
    cfg = ModelConfig(arch="timm/resnet18", batch=2, size=32)
    built = build(cfg)                     # BuiltModel: model, inputs, loss_fn, optimizer_factory ...
    loss = built.loss_fn(built.model(**built.inputs), built.inputs)

Families: ``timm/*`` (every timm model), ``hf/*`` (every transformers config
type, ``hf/<type>:<task>`` for its task heads), ``diffusion/*`` (diffusers
UNet, DiT, VAE), and the built-in ``world/*``, ``molecule/*``, ``robotics/*``,
``flex/*``. Importing the package imports no model package; builders import
theirs when called.
"""

from __future__ import annotations

from typing import Any

from . import registry
from .built import BuiltModel
from .config import ATTN_IMPLS, DTYPES, EXECUTIONS, KNOBS, MODES, ModelConfig
from .errors import DuplicateModelError, ModelBuildError, ModelZooError, UnknownModelError, one_line
from .registry import ModelEntry, get_entry, list_models
from .space import base_configs, count_configs, enumerate_configs, sample_configs
from .status import load_status

__all__ = [
    "ATTN_IMPLS", "BuiltModel", "base_configs", "DTYPES", "DuplicateModelError", "EXECUTIONS", "KNOBS", "MODES", "ModelBuildError",
    "ModelConfig", "ModelEntry", "ModelZooError", "UnknownModelError", "build", "count_configs", "default_config",
    "enumerate_configs", "get_entry", "list_models", "load_status", "registry", "sample_configs",
]


def default_config(arch: str, **overrides: Any) -> ModelConfig:
    """The architecture's base config (its default batch and size), with ``overrides``."""
    return registry.resolve(ModelConfig(arch=arch, **overrides))


def build(config: ModelConfig) -> BuiltModel:
    """Builds ``config`` deterministically; raises ``ModelBuildError`` with a one-line reason.

    The global RNG state is restored afterwards, so building does not disturb the caller's randomness.
    """
    import torch

    from conformance.seeding import host_generator_state, set_host_generator_state

    from .built import seed_everything

    entry = registry.get_entry(config.arch)
    config = registry.resolve(config)
    entry.check(config)
    host = host_generator_state()
    with torch.random.fork_rng(devices=[]):
        seed_everything(config.seed)
        try:
            built = entry.builder(config, entry)
        except ModelBuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - every builder failure becomes one reasoned error
            raise ModelBuildError(f"{config.arch}: {one_line(exc)}") from exc
        finally:
            set_host_generator_state(host)
    built.config = config
    return built
