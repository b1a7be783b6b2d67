"""The train state, its layout on the mesh, the optimizer and schedule, and the train and
eval steps compiled for the mesh.

The state is a plain dict pytree `{"step", "params", "opt_state", "rng"}` so orbax saves
and restores it as is. Shardings follow nanodo: the abstract state comes from
`jax.eval_shape(init)` (`StateLayout`), its shardings from the model's one-table rules
(optimizer moments shard like their parameters), and the real state from
`jit(init, out_shardings=...)`, so no host ever holds a full copy. The steps are compiled
ahead of time with explicit shardings (`compile_step`) for the global batches of
lemur.train.batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lemur.model import llama
from lemur.model import sharding as model_sharding
from lemur.model.config import BIAS_NAMES, LlamaConfig, Params
from lemur.model.loss import token_cross_entropy
from lemur.train.batch import Batch, BatchLayout
from lemur.train.config import OptimizerConfig, ScheduleConfig, TrainConfig

State = dict[str, Any]
StepFn = Callable[[State, Batch], tuple[State, dict[str, jax.Array]]]


def make_schedule(config: ScheduleConfig, steps: int) -> Callable[[jax.Array], jax.Array]:
    """Learning rate at optimizer step s (0-based): linear warmup, then decay to a floor.

    Written out rather than optax.warmup_cosine_decay_schedule because that one starts the
    warmup at lr 0, which makes the first step a no-op; here step 0 already uses
    peak / warmup_steps and step warmup_steps - 1 reaches the peak.
    """
    peak, warmup = config.peak_lr, config.warmup_steps
    floor = peak * config.final_lr_ratio
    end = max(config.decay_steps or steps, warmup + 1)

    def schedule(step: jax.Array) -> jax.Array:
        s = jnp.asarray(step, jnp.float32)
        warm = peak * jnp.minimum(1.0, (s + 1.0) / max(warmup, 1))
        frac = jnp.clip((s - warmup) / (end - warmup), 0.0, 1.0)
        if config.decay == "cosine":
            decayed = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        elif config.decay == "linear":
            decayed = peak - (peak - floor) * frac
        else:
            decayed = jnp.asarray(peak, jnp.float32)
        return jnp.where(s < warmup, warm, decayed)

    return schedule


def decay_mask(params: Params) -> Any:
    """True for the weights that get weight decay: every matrix, never a norm's scale or a
    bias (the usual AdamW practice, and what Qwen2's biases are trained with); the mask
    `make_optimizer` gives AdamW."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: (
            "norm" not in jax.tree_util.keystr(path)
            and getattr(path[-1], "key", None) not in BIAS_NAMES
        ),
        params,
    )


def make_optimizer(
    config: OptimizerConfig, schedule: Callable[[jax.Array], jax.Array]
) -> optax.GradientTransformation:
    """Global-norm clipping, then Adam (the paper's b1 0.9, b2 0.95), AdamW with weight decay."""
    if config.weight_decay > 0:
        adam = optax.adamw(
            schedule,
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        )
    else:  # adamw with decay 0 would still add 0 * params: a wasted pass over the weights
        adam = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
    if config.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(config.grad_clip), adam)
    return adam


def init_state(
    key: jax.Array,
    model: LlamaConfig,
    tx: optax.GradientTransformation,
    params: Params | None = None,
) -> State:
    """A fresh train state: random params (or `params`), optimizer state, step 0, RNG."""
    init_key, rng = jax.random.split(key)
    if params is None:
        params = llama.init_params(model, init_key)
    return {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": tx.init(params),
        # Raw key bits, so orbax saves it like any array. The model has no dropout today;
        # the stream is saved and restored so stochastic parts added later resume exactly.
        "rng": jax.random.key_data(rng),
    }


def state_shardings(
    abstract: State, model: LlamaConfig, tx: optax.GradientTransformation, mesh: Mesh
) -> State:
    """NamedShardings for every leaf of the state: moments shard like their params."""
    replicated = NamedSharding(mesh, P())
    params = model_sharding.param_shardings(abstract["params"], model, mesh)
    opt_state = optax.tree_map_params(
        tx,
        lambda _, s: s,
        abstract["opt_state"],
        params,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    return {"step": replicated, "params": params, "opt_state": opt_state, "rng": replicated}


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (orbax restore targets, AOT compile inputs)."""
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """The state's model, optimizer and mesh; its abstract shapes and shardings; the key a
    fresh state is made from."""

    model: LlamaConfig
    tx: optax.GradientTransformation
    mesh: Mesh
    key: jax.Array
    abstract: State
    shardings: State

    @classmethod
    def of(
        cls, model: LlamaConfig, tx: optax.GradientTransformation, mesh: Mesh, seed: int
    ) -> StateLayout:
        """The layout from `jax.eval_shape` of the init (no array made)."""
        key = jax.random.key(seed)
        init = functools.partial(init_state, model=model, tx=tx)
        abstract = jax.eval_shape(init, key)
        return cls(model, tx, mesh, key, abstract, state_shardings(abstract, model, tx, mesh))

    def target(self) -> State:
        """ShapeDtypeStructs with shardings: a restore target, an AOT compile input."""
        return with_shardings(self.abstract, self.shardings)


def token_losses(
    params: Params, batch: Batch, model: LlamaConfig, *, document_attention: bool
) -> jax.Array:
    """Per-token cross-entropy (fp32, BxL), zero where `loss_mask` is 0; the head's logits
    are made a chunk of positions at a time (`model.logits_chunk`, lemur.model.loss)."""
    kwargs = {}
    if document_attention:
        kwargs = {"segment_ids": batch["segment_ids"], "positions": batch["positions"]}
    x_BxLxD = llama.embed_tokens(params, batch["inputs"], model)
    x_BxLxD = llama.hidden_states(params, x_BxLxD, model, **kwargs)
    ce_BxL = token_cross_entropy(params, x_BxLxD, batch["targets"], model)
    return ce_BxL * batch["loss_mask"].astype(jnp.float32)


def _split_microbatches(batch: Batch, microbatches: int) -> Batch:
    """[B, L] -> [M, B/M, L], microbatch m taking rows m, M + m, 2M + m, ...

    Strided rather than contiguous: each device's block of rows then holds an equal share
    of every microbatch, so every microbatch stays spread over all data-parallel devices.
    """

    def split(x: jax.Array) -> jax.Array:
        b, rest = x.shape[0] // microbatches, x.shape[1:]
        x = jnp.swapaxes(x.reshape(b, microbatches, *rest), 0, 1)
        return _constrain(x)

    return {k: split(v) for k, v in batch.items()}


def _constrain(x_MxBxL: jax.Array) -> jax.Array:
    """Keep the microbatch axis unsplit and the rows on the batch axes (under a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x_MxBxL
    spec = model_sharding.fit_spec(P(None, model_sharding.BATCH), x_MxBxL.shape, mesh)
    return jax.lax.with_sharding_constraint(x_MxBxL, spec)


def make_train_step(
    model: LlamaConfig,
    tx: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    *,
    microbatches: int = 1,
    document_attention: bool = False,
) -> StepFn:
    """The (unjitted) train step: loss averaged over every valid token of the global batch.

    Gradients are accumulated over `microbatches` passes (lax.scan) as sums divided by
    the batch's total valid-token count, so the update equals the one-pass update.
    """

    def loss_fn(params: Params, batch: Batch, denom: jax.Array) -> jax.Array:
        return (
            token_losses(params, batch, model, document_attention=document_attention).sum() / denom
        )

    grad_fn = jax.value_and_grad(loss_fn)

    def step(state: State, batch: Batch) -> tuple[State, dict[str, jax.Array]]:
        params = state["params"]
        tokens = batch["loss_mask"].sum()
        denom = jnp.maximum(tokens, 1).astype(jnp.float32)
        if microbatches == 1:
            loss, grads = grad_fn(params, batch, denom)
        else:

            def accumulate(carry: tuple[jax.Array, Any], micro: Batch) -> tuple[Any, None]:
                loss_sum, grad_sum = carry
                loss, grads = grad_fn(params, micro, denom)
                return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            (loss, grads), _ = jax.lax.scan(
                accumulate,
                (jnp.zeros((), jnp.float32), zeros),
                _split_microbatches(batch, microbatches),
            )
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            # Checked with the loss: a finite loss can still leave overflowed weights.
            "param_norm": optax.tree.norm(new_params),
            "lr": schedule(state["step"]),
            "tokens": tokens,
        }
        new_state = {
            "step": state["step"] + 1,
            "params": new_params,
            "opt_state": opt_state,
            "rng": state["rng"],
        }
        return new_state, metrics

    return step


def make_eval_step(
    model: LlamaConfig, *, document_attention: bool = False
) -> Callable[[Params, Batch], tuple[jax.Array, jax.Array]]:
    """(params, batch) -> (summed loss, valid-token count): padding rows count for nothing."""

    def step(params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
        loss_sum = token_losses(params, batch, model, document_attention=document_attention).sum()
        return loss_sum, batch["loss_mask"].sum()

    return step


def compile_step(
    fn: Callable[..., Any],
    args: Sequence[Any],
    in_shardings: Any,
    out_shardings: Any,
    donate_argnums: int | tuple[int, ...] = (),
) -> Any:
    """`fn` compiled ahead of time for abstract `args` with explicit shardings (under the
    caller's mesh): the same executable every step, and no retracing."""
    jitted = jax.jit(
        fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums
    )
    return jitted.lower(*args).compile()


def compile_steps(
    layout: StateLayout,
    schedule: Callable[[jax.Array], jax.Array],
    config: TrainConfig,
    train_batch: BatchLayout,
    eval_batch: BatchLayout | None,
) -> tuple[Any, Any, float]:
    """The train step (state donated) and the eval step (None without `eval_batch`),
    compiled ahead of time for `layout`'s mesh; the seconds it took."""
    model, tx, shardings, state = layout.model, layout.tx, layout.shardings, layout.target()
    replicated = NamedSharding(layout.mesh, P())
    document_attention = config.data.document_attention
    train_fn = make_train_step(
        model,
        tx,
        schedule,
        microbatches=config.batch.microbatches,
        document_attention=document_attention,
    )
    eval_step, t = None, time.perf_counter()
    with jax.set_mesh(layout.mesh):
        train_step = compile_step(
            train_fn,
            (state, train_batch.abstract()),
            (shardings, train_batch.sharding),
            (shardings, replicated),
            donate_argnums=0,
        )
        if eval_batch is not None:
            eval_step = compile_eval_step(layout, config, eval_batch)
    return train_step, eval_step, time.perf_counter() - t


def compile_eval_step(layout: StateLayout, config: TrainConfig, eval_batch: BatchLayout) -> Any:
    """The eval step compiled ahead of time for `layout`'s mesh (under that mesh)."""
    with jax.set_mesh(layout.mesh):
        return compile_step(
            make_eval_step(layout.model, document_attention=config.data.document_attention),
            (layout.target()["params"], eval_batch.abstract()),
            (layout.shardings["params"], eval_batch.sharding),
            NamedSharding(layout.mesh, P()),
        )
