"""Per-device memory of a train step by formula, for targets JAX cannot compile for here.

JAX cannot compile for a GPU without one (jax-ml/jax#28376), so `lemur-train plan` on a
GPU target adds up what the step holds instead: the state (parameters, gradients and
Adam's two moments, in the parameter dtype, split over the fsdp x tensor devices), the
activations the remat policy saves for the backward pass over every layer, one layer's
working set while it is recomputed, and one chunk of the head's fp32 logits with its
gradient. It ignores XLA's buffer reuse and fragmentation: an estimate, labelled as one
wherever it is shown. `lemur-train` holds the same estimate against a CPU host's memory
before it starts (train/setup.py), where an over-large step is killed without a word.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from lemur.model.config import LlamaConfig, param_count
from lemur.model.loss import LOGITS_CHUNK_BYTES
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


@dataclasses.dataclass(frozen=True)
class StepBytes:
    """Per-device bytes of a train step by formula: the state (parameters, gradients, Adam's
    moments) and the activations (saved for the backward, one layer's working set, logits)."""

    state: float
    activations: float

    @property
    def total(self) -> float:
        """State plus activations: the estimate held against a device's memory."""
        return self.state + self.activations


def step_bytes(config: TrainConfig, model: LlamaConfig, devices: int) -> StepBytes:
    """Per-device bytes of the train step over `devices` (see the module's docstring)."""
    data, fsdp, tensor = mesh_sizes(config, devices)
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
    # The head runs a chunk of positions at a time (lemur.model.loss): one chunk's fp32
    # logits and their gradient are live, at most LOGITS_CHUNK_BYTES each by default.
    whole = 4 * model.vocab_size * tokens / tensor
    if model.logits_chunk is None:
        chunk = min(whole, LOGITS_CHUNK_BYTES)
    else:
        chunk = whole * min(model.logits_chunk, config.batch.seq_len) / config.batch.seq_len
    return StepBytes(state=state, activations=saved + working + 2 * chunk)


def mesh_fits(config: TrainConfig, devices: int) -> bool:
    """Whether the config's mesh is made of exactly `devices` devices."""
    data, fsdp, tensor = mesh_sizes(config, devices)
    return min(data, fsdp, tensor) >= 1 and data * fsdp * tensor == devices


def estimate_memory(config: TrainConfig, model: LlamaConfig, target: Target) -> Memory:
    """Per-device memory of the train step on `target` by formula, as `plan` reports it."""
    need = step_bytes(config, model, target.devices)
    hbm = target.chip.hbm_gib * GIB
    return Memory(
        fits=need.total <= hbm,
        peak=need.total,
        hbm=hbm,
        hbm_source="published HBM",
        arguments=need.state * 3 / 4,  # params and moments; the gradients are temporaries
        temporaries=need.state / 4 + need.activations,
        outputs=need.state * 3 / 4,
    )
