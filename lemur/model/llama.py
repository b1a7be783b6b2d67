"""Llama-family models as pure functions over a params pytree (no flax): init and forward.

Exactly the Llama architecture (pre-norm RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU MLP, no biases), so real weights load and give the same logits as
Hugging Face `LlamaForCausalLM` (see lemur.model.hf). Llama-2 unties the input and output
embeddings; Llama-3.1 adds "llama3" rotary scaling; the small Llama-3.2 models also tie
the output head to the embedding table (`tie_embeddings`: the params carry no `lm_head`
and the logits use `embed` transposed). Qwen2 (`qkv_bias`) adds a bias to each of the q,
k and v projections, before the rotation; `Qwen2ForCausalLM` and `MistralForCausalLM`
(without a sliding window) are otherwise this same block. The config, presets, shapes
and FLOPs are in lemur.model.config.

Layout choices:
- Per-layer parameters are stacked on a leading n_layers axis, whatever `scan_layers`
  says, so a checkpoint does not depend on how it will be run.
- q/k use Meta's original *interleaved* rotary layout (pairs (2i, 2i+1) rotate
  together); HF checkpoints permute q/k rows into a rotate-half layout, which
  lemur.model.hf undoes on import and redoes on export.
- Parameters are stored in `param_dtype` (fp32) and cast to the compute `dtype` (bf16)
  where used; norms, softmax, rotary angles and the logits are computed in fp32.

Shape letters: B batch, L sequence, D d_model, H query heads, G kv heads, K head_dim,
F d_ff, V vocab, N layers.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from lemur.model import splash
from lemur.model.config import (
    BIAS_NAMES,
    DTYPES,
    REMAT_POLICIES,
    LlamaConfig,
    Params,
    is_shape,
    param_shapes,
)
from lemur.model.sharding import constrain


def init_params(config: LlamaConfig, key: jax.Array) -> Params:
    """Random params: N(0, init_std) matrices, unit norms, zero biases (HF's Llama init)."""
    dtype = DTYPES[config.param_dtype]
    flat, treedef = jax.tree_util.tree_flatten_with_path(param_shapes(config), is_leaf=is_shape)
    keys = jax.random.split(key, len(flat))

    def leaf(path: tuple, shape: tuple[int, ...], k: jax.Array) -> jax.Array:
        name = path[-1].key
        if "norm" in name:
            return jnp.ones(shape, dtype)
        if name in BIAS_NAMES:
            return jnp.zeros(shape, dtype)
        return (config.init_std * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

    leaves = [leaf(path, shape, k) for (path, shape), k in zip(flat, keys, strict=True)]
    return jax.tree.unflatten(treedef, leaves)


def rms_norm(x_BxLxD: jax.Array, w_D: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in fp32, cast back, then scaled (Meta's and HF's order of casts)."""
    x32 = x_BxLxD.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return y.astype(x_BxLxD.dtype) * w_D.astype(x_BxLxD.dtype)


def rope_inv_freq(config: LlamaConfig) -> jax.Array:
    """Rotary inverse frequencies (K/2, fp32): theta^(-2i/K), llama3-scaled if configured."""
    K = config.head_dim
    # From an fp32 arange, as HF and Meta compute it (float64 would drift from them).
    inv_freq_K2 = 1.0 / (config.rope_theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))
    if config.rope_type == "llama3":
        inv_freq_K2 = _llama3_scaled(inv_freq_K2, config)
    return inv_freq_K2


def _llama3_scaled(inv_freq_K2: jax.Array, config: LlamaConfig) -> jax.Array:
    """Llama-3.1's scaling: wavelengths above original/low_freq_factor are stretched by
    factor, those below original/high_freq_factor kept, and those between interpolated.

    Same operations in the same fp32 order as Meta's `apply_scaling` and HF's
    `_compute_llama3_parameters` (python scalars stay weak-typed, so everything is fp32).
    """
    factor, low, high = (
        config.rope_factor,
        config.rope_low_freq_factor,
        config.rope_high_freq_factor,
    )
    original = config.rope_original_max_seq_len
    assert factor is not None and low is not None and high is not None and original
    wavelen_K2 = 2 * math.pi / inv_freq_K2
    stretched_K2 = jnp.where(wavelen_K2 > original / low, inv_freq_K2 / factor, inv_freq_K2)
    smooth_K2 = (original / wavelen_K2 - low) / (high - low)
    smoothed_K2 = (1 - smooth_K2) * stretched_K2 / factor + smooth_K2 * stretched_K2
    is_medium_K2 = ~(wavelen_K2 < original / high) & ~(wavelen_K2 > original / low)
    return jnp.where(is_medium_K2, smoothed_K2, stretched_K2)


def rope_angles(positions_BxL: jax.Array, inv_freq_K2: jax.Array) -> tuple[jax.Array, ...]:
    """cos and sin (BxLxK/2, fp32) of the rotary angles position * inv_freq."""
    angles_BxLxK2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq_K2
    return jnp.cos(angles_BxLxK2), jnp.sin(angles_BxLxK2)


def apply_rope(x_BxLxHxK: jax.Array, cos_BxLxK2: jax.Array, sin_BxLxK2: jax.Array) -> jax.Array:
    """Rotate interleaved pairs (x[2i], x[2i+1]) by the angles (Meta's layout), in fp32."""
    B, L, H, K = x_BxLxHxK.shape
    x_BxLxHxK2x2 = x_BxLxHxK.astype(jnp.float32).reshape(B, L, H, K // 2, 2)
    x0, x1 = x_BxLxHxK2x2[..., 0], x_BxLxHxK2x2[..., 1]
    cos, sin = cos_BxLxK2[:, :, None, :], sin_BxLxK2[:, :, None, :]
    out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(B, L, H, K).astype(x_BxLxHxK.dtype)


def compile_platform() -> str:
    """The platform the step is compiled for: the context mesh's devices (a TPU topology
    compiled ahead of time on a CPU host says "tpu"), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def choose_attention_impl(
    config: LlamaConfig, head_dim: int, seq_len: int, platform: str, dense_mask: bool
) -> str:
    """The attention backend: the configured one, else splash on TPU (for lengths that
    are a multiple of its blocks), cuDNN on GPU for shapes it supports, XLA otherwise.

    Splash takes causal and document masks only: with a dense mask (the decode prefill's
    padding) the XLA path runs instead, whatever the config says.
    """
    impl = config.attention_impl
    if impl is None and platform == "tpu":
        impl = "splash" if splash.block_size(seq_len) is not None else "xla"
    elif impl is None:
        fits = config.dtype in ("bfloat16", "float16") and head_dim % 8 == 0 and head_dim <= 128
        impl = "cudnn" if platform == "gpu" and fits else "xla"
    return "xla" if impl == "splash" and dense_mask else impl


def attention(
    q_BxLxHxK: jax.Array,
    k_BxLxGxK: jax.Array,
    v_BxLxGxK: jax.Array,
    mask_Bx1xLxL: jax.Array | None,
    config: LlamaConfig,
    *,
    segment_ids_BxL: jax.Array | None = None,
) -> jax.Array:
    """Causal grouped-query attention (fp32 softmax), within documents when segment ids are
    given (tokens attend only to tokens of their own id), and within `mask` when one is.

    Splash runs through lemur.model.splash (an explicit `splash` with a length that is no
    multiple of its blocks is an error there); the others through
    jax.nn.dot_product_attention.
    """
    _, L, _, K = q_BxLxHxK.shape
    platform = compile_platform()
    impl = choose_attention_impl(config, K, L, platform, dense_mask=mask_Bx1xLxL is not None)
    if impl == "splash":
        # Interpreted off TPU: exact, slow, for tests (Mosaic compiles for TPU only).
        return splash.splash_attention(
            q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL, interpret=platform != "tpu"
        )
    if segment_ids_BxL is not None:
        same_doc = segment_ids_BxL[:, None, :, None] == segment_ids_BxL[:, None, None, :]
        mask_Bx1xLxL = same_doc if mask_Bx1xLxL is None else mask_Bx1xLxL & same_doc
    call = functools.partial(
        jax.nn.dot_product_attention,
        q_BxLxHxK,
        k_BxLxGxK,
        v_BxLxGxK,
        mask=mask_Bx1xLxL,
        is_causal=True,
    )
    if impl == "cudnn" and config.attention_impl is None:
        try:  # auto: an old cuDNN or an unsupported shape raises at trace time; use XLA then
            return call(implementation="cudnn")
        except (ValueError, RuntimeError, NotImplementedError, TypeError):
            return call(implementation="xla")
    return call(implementation=impl)


def attention_qkv(
    x_BxLxD: jax.Array,
    layer: Params,
    config: LlamaConfig,
    cos_BxLxK2: jax.Array,
    sin_BxLxK2: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q (BxLxHxK), k and v (BxLxGxK) of the pre-normed input (plus the Qwen2 biases),
    rotary applied to q and k."""
    dt = config.compute_dtype
    h_BxLxD = rms_norm(x_BxLxD, layer["attn_norm"], config.norm_eps)
    q_BxLxHxK = jnp.einsum("bld,dhk->blhk", h_BxLxD, layer["wq"].astype(dt))
    k_BxLxGxK = jnp.einsum("bld,dgk->blgk", h_BxLxD, layer["wk"].astype(dt))
    v_BxLxGxK = jnp.einsum("bld,dgk->blgk", h_BxLxD, layer["wv"].astype(dt))
    if config.qkv_bias:  # added in the compute dtype, as torch's Linear does
        q_BxLxHxK = q_BxLxHxK + layer["bq"].astype(dt)
        k_BxLxGxK = k_BxLxGxK + layer["bk"].astype(dt)
        v_BxLxGxK = v_BxLxGxK + layer["bv"].astype(dt)
    q_BxLxHxK = constrain(q_BxLxHxK, "BLHK")
    k_BxLxGxK = constrain(k_BxLxGxK, "BLHK")
    v_BxLxGxK = constrain(v_BxLxGxK, "BLHK")
    q_BxLxHxK = apply_rope(q_BxLxHxK, cos_BxLxK2, sin_BxLxK2)
    k_BxLxGxK = apply_rope(k_BxLxGxK, cos_BxLxK2, sin_BxLxK2)
    return q_BxLxHxK, k_BxLxGxK, v_BxLxGxK


def attention_residual(
    x_BxLxD: jax.Array, o_BxLxHxK: jax.Array, layer: Params, config: LlamaConfig
) -> jax.Array:
    """x + the output projection of the attention heads."""
    x_BxLxD = x_BxLxD + jnp.einsum(
        "blhk,hkd->bld", o_BxLxHxK, layer["wo"].astype(config.compute_dtype)
    )
    return constrain(x_BxLxD, "BLD")


def mlp_residual(x_BxLxD: jax.Array, layer: Params, config: LlamaConfig) -> jax.Array:
    """x + SwiGLU(norm(x))."""
    dt = config.compute_dtype
    h_BxLxD = rms_norm(x_BxLxD, layer["mlp_norm"], config.norm_eps)
    gate_BxLxF = jnp.einsum("bld,df->blf", h_BxLxD, layer["w_gate"].astype(dt))
    up_BxLxF = jnp.einsum("bld,df->blf", h_BxLxD, layer["w_up"].astype(dt))
    hidden_BxLxF = constrain(jax.nn.silu(gate_BxLxF) * up_BxLxF, "BLF")
    x_BxLxD = x_BxLxD + jnp.einsum("blf,fd->bld", hidden_BxLxF, layer["w_down"].astype(dt))
    return constrain(x_BxLxD, "BLD")


def block(
    x_BxLxD: jax.Array,
    layer: Params,
    config: LlamaConfig,
    cos_BxLxK2: jax.Array,
    sin_BxLxK2: jax.Array,
    segment_ids_BxL: jax.Array | None,
) -> jax.Array:
    """One pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""
    q_BxLxHxK, k_BxLxGxK, v_BxLxGxK = attention_qkv(x_BxLxD, layer, config, cos_BxLxK2, sin_BxLxK2)
    o_BxLxHxK = attention(
        q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, None, config, segment_ids_BxL=segment_ids_BxL
    )
    x_BxLxD = attention_residual(x_BxLxD, o_BxLxHxK, layer, config)
    return mlp_residual(x_BxLxD, layer, config)


def embed_tokens(params: Params, tokens_BxL: jax.Array, config: LlamaConfig) -> jax.Array:
    """Look up token embeddings in the compute dtype."""
    # Cast before the lookup so that, under FSDP, the table is gathered in bf16 (half the
    # bytes); the rows are the same as gathering in fp32 and casting after.
    embed_VxD = constrain(params["embed"].astype(config.compute_dtype), "VD")
    x_BxLxD = jnp.take(embed_VxD, constrain(tokens_BxL, "BL"), axis=0)
    return constrain(x_BxLxD, "BLD")


def forward_embeddings(
    params: Params,
    x_BxLxD: jax.Array,
    config: LlamaConfig,
    *,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> jax.Array:
    """Transformer blocks, final norm and output head over input embeddings -> fp32 logits."""
    x_BxLxD = hidden_states(params, x_BxLxD, config, segment_ids=segment_ids, positions=positions)
    return output_head(params, x_BxLxD, config)


def hidden_states(
    params: Params,
    x_BxLxD: jax.Array,
    config: LlamaConfig,
    *,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> jax.Array:
    """Transformer blocks and final norm over input embeddings: what the head reads."""
    B, L, _ = x_BxLxD.shape
    x_BxLxD = x_BxLxD.astype(config.compute_dtype)
    positions_BxL = (
        jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L)) if positions is None else positions
    )
    cos_BxLxK2, sin_BxLxK2 = rope_angles(positions_BxL, rope_inv_freq(config))
    block_fn = functools.partial(
        block,
        config=config,
        cos_BxLxK2=cos_BxLxK2,
        sin_BxLxK2=sin_BxLxK2,
        segment_ids_BxL=segment_ids,  # document masking: attend only within one's document
    )
    if config.remat != "none":
        # prevent_cse only matters outside scan (scan already stops CSE across iterations).
        block_fn = jax.checkpoint(
            block_fn, policy=REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers
        )
    if config.scan_layers:
        x_BxLxD, _ = jax.lax.scan(
            lambda x, layer: (block_fn(x, layer), None), x_BxLxD, params["layers"]
        )
    else:
        # unstack's transpose is a stack, so the layer gradients land in one buffer.
        unstacked = {name: jnp.unstack(w) for name, w in params["layers"].items()}
        for i in range(config.n_layers):
            x_BxLxD = block_fn(x_BxLxD, {name: ws[i] for name, ws in unstacked.items()})
    return rms_norm(x_BxLxD, params["final_norm"], config.norm_eps)


def output_head(params: Params, x_BxLxD: jax.Array, config: LlamaConfig) -> jax.Array:
    """fp32 logits from the final hidden states: lm_head, or embed transposed when tied."""
    dt = config.compute_dtype
    if config.tie_embeddings:
        # embed is VxD sharded (tensor, fsdp): the product comes out V-split over tensor,
        # which is the logits' own layout, so no transpose is materialised.
        logits_BxLxV = jnp.einsum(
            "bld,vd->blv", x_BxLxD, params["embed"].astype(dt), preferred_element_type=jnp.float32
        )
    else:
        logits_BxLxV = jnp.einsum(
            "bld,dv->blv", x_BxLxD, params["lm_head"].astype(dt), preferred_element_type=jnp.float32
        )
    return constrain(logits_BxLxV, "BLV")


def forward(
    params: Params,
    tokens_BxL: jax.Array,
    config: LlamaConfig,
    *,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> jax.Array:
    """Logits (BxLxV, fp32) for int tokens; causal, optionally masked to documents.

    segment_ids (BxL int): tokens attend only to earlier tokens with the same id.
    positions (BxL int): rotary positions, e.g. restarting at 0 in each packed document;
    default 0..L-1.
    """
    x_BxLxD = embed_tokens(params, tokens_BxL, config)
    return forward_embeddings(params, x_BxLxD, config, segment_ids=segment_ids, positions=positions)
