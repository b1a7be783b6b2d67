"""The `model:` section of a config: a preset of `PRESETS` with field overrides.

The trainer's config holds it (lemur.train.config), and a run's checkpoint keeps it in its
`meta`, from which `lemur-eval` and `lemur-convert from-run` rebuild the model
(lemur.eval.load): both read it here, below them both. `ConfigError` is the one error of
a config section, shared with every other section of the trainer's config.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from lemur.model.config import PRESETS, SHAPE_FIELDS, LlamaConfig
from lemur.typed_yaml import TypedLoader

# LlamaConfig fields a config may not override: the vocabulary comes from `model.vocab_size`
# (or the shards' tokenizer), so it cannot disagree with the data.
_FIXED_MODEL_FIELDS = ("vocab_size",)


class ConfigError(ValueError):
    """A config that cannot run; the message names the offending key."""


def check_key(ok: bool, key: str, message: str) -> None:
    """ConfigError `config: KEY MESSAGE` unless `ok`."""
    if not ok:
        raise ConfigError(f"config: {key} {message}")


# Builds config dataclasses from YAML mappings, raising ConfigError naming the key.
CONFIG_LOADER = TypedLoader(ConfigError, "config")


@dataclass(frozen=True)
class ModelConfig:
    """Which Llama: a preset of lemur.model.config.PRESETS with field overrides.

    `preset: null` takes every field from the `init_from` checkpoint's config.json at
    start-up (overrides still apply): a fine-tuning config fits any pre-trained model.
    """

    preset: str | None = "tiny"
    vocab_size: int | None = None  # None: the shards' tokenizer vocab size
    overrides: dict[str, Any] = field(default_factory=dict)  # LlamaConfig fields
    init_from: str | None = None  # an HF model folder or a lemur checkpoint (lemur-convert)

    def __post_init__(self) -> None:
        check_key(
            self.preset is None or self.preset in PRESETS,
            "model.preset",
            f"must be one of {', '.join(PRESETS)} or null, got {self.preset!r}",
        )
        check_key(
            self.vocab_size is None or self.vocab_size > 0,
            "model.vocab_size",
            f"must be positive, got {self.vocab_size}",
        )
        hints = typing.get_type_hints(LlamaConfig)
        coerced = {}
        for name, value in self.overrides.items():
            key = f"model.overrides.{name}"
            check_key(
                name in hints and name not in _FIXED_MODEL_FIELDS,
                key,
                "is not an overridable LlamaConfig field (known: "
                f"{', '.join(n for n in hints if n not in _FIXED_MODEL_FIELDS)}"
                "; set the vocabulary with model.vocab_size)",
            )
            coerced[name] = CONFIG_LOADER.coerce(value, hints[name], key)
        object.__setattr__(self, "overrides", coerced)
        if self.complete:
            self.llama(self.vocab_size or 32000)  # validates the combination now

    @property
    def complete(self) -> bool:
        """Whether the config alone gives the model (a preset, or every shape overridden)."""
        return self.preset is not None or set(SHAPE_FIELDS) <= set(self.overrides)

    def llama(self, data_vocab_size: int | None = None) -> LlamaConfig:
        """The LlamaConfig; `data_vocab_size` fills in a vocab_size left to the data."""
        if not self.complete:
            raise ConfigError(
                "config: model.preset is null: the model is model.init_from's, read at start-up"
            )
        preset = PRESETS[self.preset] if self.preset is not None else None
        vocab = self.vocab_size or data_vocab_size or (preset.vocab_size if preset else 32000)
        try:
            if preset is None:
                return LlamaConfig(vocab_size=vocab, **self.overrides)
            return dataclasses.replace(preset, vocab_size=vocab, **self.overrides)
        except ValueError as e:
            raise ConfigError(f"config: model: {e}") from None


def model_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """The `model:` section from a mapping (a config's, or a run checkpoint's meta)."""
    return CONFIG_LOADER.build(ModelConfig, raw, "model")
