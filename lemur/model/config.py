"""Llama-family model configs: `LlamaConfig` (validated shapes and numerics), the published
presets (Llama-2/3, Qwen2.5, Mistral), and what follows from a config alone: the params
pytree's shapes, the parameter count, the training FLOPs per token.

One config covers the three families: they differ only in flags of the same block.
Qwen2 adds biases to the q, k and v projections (`qkv_bias`) and ties the head on its
small sizes; Mistral (without a sliding window) is Llama's block with other sizes. `arch`
names the Hugging Face family the weights come from and go back to.

The functions over params (init, forward) are in lemur.model.llama; see its docstring for
the architecture and the params layout.

Shape letters: D d_model, H query heads, G kv heads, K head_dim, F d_ff, V vocab, N layers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]

DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# remat policies for one transformer block: "none" keeps every activation; "full" keeps
# only the block input; "dots" keeps matmul outputs and recomputes the cheap elementwise
# ops and the attention core (the usual memory/compute sweet spot).
REMAT_POLICIES: dict[str, Any] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Attention kernels (lemur.model.llama.attention): None picks splash on TPU, cuDNN on GPU
# where it fits, XLA otherwise; "splash" off TPU runs interpreted (tests only: slow).
ATTENTION_IMPLS = (None, "xla", "cudnn", "splash")
# Rotary frequency schemes: "default" is theta^(-2i/K) (Llama-2, Llama-3.0); "llama3"
# stretches the low frequencies by rope_factor, smoothly (Llama-3.1 and later).
ROPE_TYPES = ("default", "llama3")
# The Hugging Face families (model_type) lemur's block reproduces exactly.
ARCHS = ("llama", "qwen2", "mistral")
# The per-layer bias vectors (Qwen2's q, k, v projections): zero at init, no weight decay.
BIAS_NAMES = ("bq", "bk", "bv")
# The fields of a "llama3" scaling, as HF's rope_scaling keys name them.
LLAMA3_ROPE_FIELDS: dict[str, str] = {
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_seq_len": "original_max_position_embeddings",
}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shapes and numerics of a Llama-family model; hashable, so it can be a jit static arg."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"  # compute
    param_dtype: str = "float32"  # storage (and optimizer master copy)
    remat: str = "none"  # "none" | "full" | "dots"
    scan_layers: bool = False  # lax.scan over layers: compile time flat in depth
    attention_impl: str | None = None  # "xla" | "cudnn" | "splash" | None: auto by platform
    # Positions per chunk of the training loss's head + cross-entropy (lemur.model.loss):
    # None bounds a chunk's fp32 logits per device (256 MiB); >= seq_len is unchunked.
    logits_chunk: int | None = None
    init_std: float = 0.02  # HF's initializer_range; norms start at 1
    tie_embeddings: bool = False  # logits = h @ embed.T, no lm_head (Llama-3.2 1B/3B)
    arch: str = "llama"  # the HF family: "llama" | "qwen2" | "mistral"
    qkv_bias: bool = False  # biases on the q, k, v projections (Qwen2; HF's Qwen2 always has them)
    # Rotary scaling: "default" (none) or "llama3"; the four rope_* fields below are set
    # for "llama3" only, and must be None otherwise so that an ignored value cannot hide.
    rope_type: str = "default"
    rope_factor: float | None = None
    rope_low_freq_factor: float | None = None
    rope_high_freq_factor: float | None = None
    rope_original_max_seq_len: int | None = None

    def __post_init__(self) -> None:
        """Reject configs that cannot describe a Llama model, naming the bad field."""
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if not self.rope_theta > 0 or not self.norm_eps > 0 or not self.init_std > 0:
            raise ValueError("rope_theta, norm_eps and init_std must be > 0")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"LlamaConfig.{name} must be one of {sorted(DTYPES)}, "
                    f"got {getattr(self, name)!r}"
                )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"LlamaConfig.remat must be one of {sorted(REMAT_POLICIES)}, got {self.remat!r}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"LlamaConfig.attention_impl must be one of {ATTENTION_IMPLS}, "
                f"got {self.attention_impl!r}"
            )
        chunk = self.logits_chunk
        if chunk is not None and (
            not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0
        ):
            raise ValueError(
                f"LlamaConfig.logits_chunk must be a positive int or None, got {chunk!r}"
            )
        for name in ("scan_layers", "tie_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"LlamaConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.qkv_bias != (self.arch == "qwen2"):
            # So that every config is a model its HF family can hold: Qwen2 always has
            # the three biases, Llama and Mistral never.
            raise ValueError(
                f"LlamaConfig.qkv_bias is {self.qkv_bias} for arch {self.arch!r}: "
                "q/k/v biases are Qwen2's (qkv_bias true exactly when arch is 'qwen2')"
            )
        self._check_rope_scaling()

    def _check_rope_scaling(self) -> None:
        """rope_type is known, and the llama3 fields are all set for it and unset otherwise."""
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"LlamaConfig.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}"
            )
        values = {name: getattr(self, name) for name in LLAMA3_ROPE_FIELDS}
        if self.rope_type != "llama3":
            stray = [name for name, value in values.items() if value is not None]
            if stray:
                raise ValueError(
                    f"LlamaConfig.{stray[0]} is set but rope_type is "
                    f"{self.rope_type!r} (only 'llama3' uses it)"
                )
            return
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"LlamaConfig.{name} must be a positive number for "
                    f"rope_type 'llama3', got {value!r}"
                )
        if not isinstance(self.rope_original_max_seq_len, int):
            raise ValueError(
                "LlamaConfig.rope_original_max_seq_len must be an int, got "
                f"{self.rope_original_max_seq_len!r}"
            )
        if not self.rope_high_freq_factor > self.rope_low_freq_factor:  # type: ignore[operator]
            # The smoothing divides by their difference.
            raise ValueError(
                f"LlamaConfig.rope_high_freq_factor {self.rope_high_freq_factor} "
                f"must exceed rope_low_freq_factor {self.rope_low_freq_factor}"
            )

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.d_model // self.n_heads

    @property
    def compute_dtype(self) -> Any:
        """The jnp dtype of activations and matmul inputs."""
        return DTYPES[self.dtype]


_LLAMA2 = dict(vocab_size=32000, max_seq_len=4096, rope_theta=10000.0, norm_eps=1e-5)
# Llama-3.1/3.2: 128K vocab, theta 500000, 128K context through llama3 rope scaling.
_LLAMA3 = dict(
    vocab_size=128256,
    max_seq_len=131072,
    rope_theta=500000.0,
    norm_eps=1e-5,
    rope_type="llama3",
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_seq_len=8192,
)
# Qwen2.5: 151,936-id embedding (152,064 on 7B and up; the tokenizer uses 151,665 of them),
# biased q/k/v, theta 1e6, eps 1e-6; the small sizes tie the head. No sliding window
# (their config.json says use_sliding_window: false).
_QWEN25 = dict(arch="qwen2", qkv_bias=True, rope_theta=1000000.0, norm_eps=1e-6)
PRESETS: dict[str, LlamaConfig] = {
    # Published Llama-2 shapes (Touvron et al. 2023; HF config.json of meta-llama/Llama-2-*).
    "llama2-7b": LlamaConfig(
        **_LLAMA2, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=11008
    ),
    "llama2-13b": LlamaConfig(
        **_LLAMA2, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=40, d_ff=13824
    ),
    "llama2-70b": LlamaConfig(
        **_LLAMA2, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672
    ),
    # HF config.json of meta-llama/Llama-3.1-8B and meta-llama/Llama-3.2-1B (tied head).
    "llama3.1-8b": LlamaConfig(
        **_LLAMA3, rope_factor=8.0, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336
    ),
    "llama3.2-1b": LlamaConfig(
        **_LLAMA3,
        rope_factor=32.0,
        d_model=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        d_ff=8192,
        tie_embeddings=True,
    ),
    # HF config.json of Qwen/Qwen2.5-0.5B, -1.5B and -7B (the base models).
    "qwen2.5-0.5b": LlamaConfig(
        **_QWEN25,
        vocab_size=151936,
        max_seq_len=32768,
        d_model=896,
        n_layers=24,
        n_heads=14,
        n_kv_heads=2,
        d_ff=4864,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": LlamaConfig(
        **_QWEN25,
        vocab_size=151936,
        max_seq_len=131072,
        d_model=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        d_ff=8960,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": LlamaConfig(
        **_QWEN25,
        vocab_size=152064,
        max_seq_len=131072,
        d_model=3584,
        n_layers=28,
        n_heads=28,
        n_kv_heads=4,
        d_ff=18944,
    ),
    # HF config.json of mistralai/Mistral-7B-v0.3 (sliding_window: null; v0.1's 4096-token
    # window is not supported).
    "mistral-7b-v0.3": LlamaConfig(
        arch="mistral",
        vocab_size=32768,
        max_seq_len=32768,
        rope_theta=1000000.0,
        norm_eps=1e-5,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        d_ff=14336,
    ),
    # ~1.1B parameters with Llama-2's head_dim 128 and 4:1 GQA: one-GPU MFU benchmarks.
    "llama-1b": LlamaConfig(
        **_LLAMA2, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=4, d_ff=8192
    ),
    # Tests and CPU smoke runs: GQA included; fp32 so results compare tightly across runs.
    "tiny": LlamaConfig(
        vocab_size=512,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=192,
        max_seq_len=256,
        dtype="float32",
    ),
}


def config_from_preset(name: str, **overrides: Any) -> LlamaConfig:
    """A preset with some fields replaced (validated again)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)


def param_shapes(config: LlamaConfig) -> Params:
    """The params pytree's shapes, without allocating anything (no lm_head when tied; q/k/v
    biases, H x K and G x K per layer, with qkv_bias)."""
    D, N, H, G, K, F, V = (
        config.d_model,
        config.n_layers,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
        config.d_ff,
        config.vocab_size,
    )
    shapes: Params = {
        "embed": (V, D),
        "layers": {
            "attn_norm": (N, D),
            "wq": (N, D, H, K),
            "wk": (N, D, G, K),
            "wv": (N, D, G, K),
            "wo": (N, H, K, D),
            "mlp_norm": (N, D),
            "w_gate": (N, D, F),
            "w_up": (N, D, F),
            "w_down": (N, F, D),
        },
        "final_norm": (D,),
    }
    if config.qkv_bias:
        shapes["layers"] |= {"bq": (N, H, K), "bk": (N, G, K), "bv": (N, G, K)}
    if not config.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def is_shape(x: Any) -> bool:
    """Leaves of the param_shapes tree are tuples."""
    return isinstance(x, tuple)


def param_count(config: LlamaConfig) -> int:
    """Number of parameters (embeddings and norms included), as an exact Python int."""
    shapes = jax.tree.leaves(param_shapes(config), is_leaf=is_shape)
    return sum(functools.reduce(lambda a, b: a * b, shape, 1) for shape in shapes)


def flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """Training (fwd+bwd) FLOPs per token, MaxText's convention, for MFU.

    6 x matmul params (all but the input embedding and norms; the output head included,
    tied or not: it is a D x V matmul either way) plus attention scores and values:
    2 matmuls x 2 FLOPs x L x H x K per layer per token forward, halved for the causal
    mask, x3 for forward + backward.
    """
    D, H, G, K, F = (
        config.d_model,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
        config.d_ff,
    )
    per_layer = D * H * K + 2 * D * G * K + H * K * D + 3 * D * F
    matmul_params = config.n_layers * per_layer + D * config.vocab_size
    attention = config.n_layers * 2 * seq_len * H * K
    return float(6 * matmul_params + 3 * attention)
