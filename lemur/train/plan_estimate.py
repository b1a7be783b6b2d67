"""Per-device memory of a train step by formula, for targets JAX cannot compile for here.

JAX cannot compile for a GPU without one (jax-ml/jax#28376), so `lemur-train plan` on a
GPU target adds up what the step holds instead: the state (parameters, gradients and
Adam's two moments, in the parameter dtype, split over the fsdp x tensor devices), the
activations the remat policy saves for the backward pass over every layer, one layer's
working set while it is recomputed, and the fp32 logits with their gradient. It ignores
XLA's buffer reuse and fragmentation: an estimate, labelled as one wherever it is shown.
"""

from __future__ import annotations

import jax.numpy as jnp

from lemur.model.config import LlamaConfig, param_count
from lemur.train.config import TrainConfig
from lemur.train.plan_targets import GIB, Memory, Target

NOT_COMPILED = (
    "JAX cannot compile for a GPU without one (jax-ml/jax#28376): "
    "memory below is an analytic estimate, not the compiler's"
)


def _per_token_bytes(model: LlamaConfig) -> dict[str, int]:
    """Bytes one token's activations take in one layer: what each remat policy saves."""
    D, H, G, K, F = model.d_model, model.n_heads, model.n_kv_heads, model.head_dim, model.d_ff
    width = jnp.dtype(model.compute_dtype).itemsize
    matmuls = H * K + 2 * G * K + D + 2 * F + D  # q, k, v, attention out, gate, up, down
    elementwise = 3 * D + H * K + 2 * F  # norms, residual, attention core, silu(gate) * up
    return {
        "full": D * width,  # the block's input only
        "dots": matmuls * width,
        "none": (matmuls + elementwise) * width,
    }


def mesh_sizes(config: TrainConfig, devices: int) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) sizes of the config's mesh over `devices`."""
    sizes = [config.mesh.data, config.mesh.fsdp, config.mesh.tensor]
    known = 1
    for size in sizes:
        known *= size if size != -1 else 1
    data, fsdp, tensor = (devices // known if s == -1 else s for s in sizes)
    return data, fsdp, tensor


def estimate_memory(config: TrainConfig, model: LlamaConfig, target: Target) -> Memory:
    """Per-device bytes of the train step by formula (see the module's docstring)."""
    data, fsdp, tensor = mesh_sizes(config, target.devices)
    # Parameters, gradients and Adam's two moments, split over the fsdp x tensor devices.
    state = 4 * param_count(model) * jnp.dtype(model.param_dtype).itemsize / (fsdp * tensor)
    rows = config.batch.size / config.batch.microbatches / (data * fsdp)
    tokens = rows * config.batch.seq_len  # per device per microbatch
    per_token = _per_token_bytes(model)
    saved = model.n_layers * per_token[model.remat] * tokens / tensor
    working = per_token["none"] * tokens / tensor
    # Attention scores and probabilities in fp32 (XLA's path: cuDNN keeps none).
    if model.attention_impl == "xla":
        working += 2 * 4 * model.n_heads * config.batch.seq_len * tokens / tensor
    logits = 2 * 4 * model.vocab_size * tokens / tensor  # fp32 logits and their gradient
    activations = saved + working + logits
    hbm = target.chip.hbm_gib * GIB
    peak = state + activations
    return Memory(
        fits=peak <= hbm,
        peak=peak,
        hbm=hbm,
        hbm_source="published HBM",
        arguments=state * 3 / 4,  # params and moments; the gradients are temporaries
        temporaries=state / 4 + activations,
        outputs=state * 3 / 4,
    )
