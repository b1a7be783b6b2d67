"""Where a run starts: the newest good checkpoint, a pretrained model, or a fresh state."""

from __future__ import annotations

import dataclasses
import functools

import jax

from lemur.model import checkpoint as model_checkpoint
from lemur.model import llama, pretrained
from lemur.model import sharding as model_sharding
from lemur.model.config import Params
from lemur.model.grow import grow_vocab
from lemur.train import interrupt
from lemur.train import step as step_lib
from lemur.train.checkpoint import CheckpointDamaged
from lemur.train.setup import RunError, agree
from lemur.train.train_stream import LoaderStateMismatch


class Resume:
    """The `Trainer` methods that choose, restore and check the starting state."""

    def _initial_state(self) -> tuple[step_lib.State | None, int, int | None]:
        """(state, start step, resumed-from step): newest good checkpoint, pretrained or fresh.

        The state is None when the newest checkpoint is already at `steps` (nothing to do).
        """
        for note in self.notes:  # what plan_run resolved (the model, steps, warmup)
            self.reporter.message(note)
        steps = self.checkpointer.all_steps()
        if steps and not self.config.checkpoint.resume:
            raise RunError(
                f"{self.checkpointer.directory} holds checkpoints (latest step "
                f"{steps[-1]}); set checkpoint.resume=true or use another run_dir"
            )
        if steps:
            return self._resume(steps[::-1])
        init = functools.partial(step_lib.init_state, model=self.model, tx=self.tx)
        if self.config.model.init_from:
            params = self._pretrained_params()
            state = jax.jit(
                lambda key, p: init(key, params=p), out_shardings=self.shardings, donate_argnums=1
            )(self.key, params)
        else:
            state = jax.jit(init, out_shardings=self.shardings)(self.key)
        return state, 0, None

    def _pretrained_params(self) -> Params:
        """`model.init_from`'s params on the mesh, its vocabulary grown to the model's."""
        path = self.config.model.init_from
        if pretrained.kind(path) == "hf":
            return self._hf_params(path)
        saved = model_checkpoint.load_checkpoint_config(path).vocab_size  # checked by resolve_model
        if saved == self.model.vocab_size:
            target = step_lib.with_shardings(self.abstract["params"], self.shardings["params"])
            return model_checkpoint.load_params(path, target)[0]
        small = dataclasses.replace(self.model, vocab_size=saved)
        abstract = jax.eval_shape(functools.partial(llama.init_params, small), self.key)
        shardings = model_sharding.param_shardings(abstract, small, self.mesh)
        params, _ = model_checkpoint.load_params(path, step_lib.with_shardings(abstract, shardings))
        self.reporter.message(
            f"lemur-train: {path}: vocabulary grown from {saved:,} to {self.model.vocab_size:,} "
            "ids (the tokenizer's added pieces); new rows = the mean of the existing ones"
        )
        # Eagerly, on the sharded arrays: only the embedding and the head are new arrays;
        # every other leaf passes through as it is (a jit would copy them).
        grown, _ = grow_vocab(params, small, self.model.vocab_size)
        return jax.tree.map(jax.device_put, grown, self.shardings["params"])

    def _hf_params(self, path: str) -> Params:
        """An HF folder's params converted on load (host numpy, one tensor at a time), grown
        to the model's vocabulary, then each process puts its own shards on its devices."""
        self.reporter.message(f"lemur-train: {path}: converting the HF checkpoint on load")
        params = pretrained.load_hf_params(path, self.model.param_dtype)
        saved = dataclasses.replace(self.model, vocab_size=params["embed"].shape[0])
        if saved.vocab_size != self.model.vocab_size:  # checked by resolve_model
            params, _ = grow_vocab(params, saved, self.model.vocab_size)
            self.reporter.message(
                f"lemur-train: {path}: vocabulary grown from {saved.vocab_size:,} to "
                f"{self.model.vocab_size:,} ids; new rows = the mean of the existing ones"
            )
        return jax.tree.map(
            lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]),
            params,
            self.shardings["params"],
        )

    def _resume(self, candidates: list[int]) -> tuple[step_lib.State | None, int, int]:
        """Restore the newest checkpoint that restores completely; set damaged ones aside."""
        skipped: list[tuple[int, str]] = []
        for step in candidates:
            try:
                state = self._restore(step)
            except CheckpointDamaged as e:
                skipped.append((step, str(e)))
                continue
            self._set_aside(skipped)
            return state, step, step
        listing = "; ".join(f"{step}: {reason}" for step, reason in skipped)
        raise RunError(
            f"no checkpoint in {self.checkpointer.directory} restores ({listing}); "
            "move them away, or use another run_dir or checkpoint.dir"
        )

    def _restore(self, step: int) -> step_lib.State | None:
        """Checkpoint `step` into the mesh (None: it is at `steps`); CheckpointDamaged if not."""
        ckpt = self.checkpointer
        agree(ckpt.problem(step))
        self._check_shapes(step)
        if step > self.config.steps:
            raise RunError(
                f"steps ({self.config.steps}) is below the latest checkpoint, step "
                f"{step} in {ckpt.directory}: nothing to train; raise steps, or "
                "use another run_dir or checkpoint.dir"
            )
        target = step_lib.with_shardings(self.abstract, self.shardings)
        problem, restored = None, None
        try:
            restored = ckpt.restore(step, target)
        except CheckpointDamaged as e:
            problem = str(e)
        agree(problem)
        state, data_state, meta = restored
        if step == self.config.steps:
            return None  # restored all the same: a finished run's last checkpoint is checked
        try:
            self.loader.set_state(data_state)
        except LoaderStateMismatch:
            raise RunError(
                f"{ckpt.step_dir(step)}: the loader state comes from another data pipeline "
                "(directories' contents, weights, seed or seq_len differ); --set "
                "data.strict_state=false continues from its position anyway"
            ) from None
        except (ValueError, KeyError, TypeError) as e:
            raise RunError(f"{ckpt.step_dir(step)}: loader state: {e}") from None
        # The losses logged since the last record: the next record averages the same steps
        # as in an uninterrupted run.
        self.resumed_window = [float(x) for x in meta.get("log_window", [])]
        return state

    def _check_shapes(self, step: int) -> None:
        """Refuse (one line) a checkpoint of another model or vocabulary than this run's."""
        problem, saved = None, {}
        try:
            saved = self.checkpointer.param_shapes(step)
        except CheckpointDamaged as e:
            problem = str(e)
        agree(problem)
        flat = jax.tree_util.tree_flatten_with_path(self.abstract["params"])[0]
        want = {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in flat}
        if saved == want:
            return
        where = self.checkpointer.step_dir(step)
        embed = "['embed']"
        if embed in saved and embed in want and saved[embed][0] != want[embed][0]:
            source = (
                "model.vocab_size"
                if self.config.model.vocab_size
                else f"the tokenizer of {self.config.data.dirs[0]}"
            )
            raise RunError(
                f"{where}: the checkpoint has vocab_size {saved[embed][0]}, the "
                f"model {want[embed][0]} (from {source}); resuming needs the "
                "tokenizer it was trained with (or another run_dir)"
            )
        key = next(k for k in sorted(set(saved) | set(want)) if saved.get(k) != want.get(k))
        raise RunError(
            f"{where}: parameter {key} has shape {saved.get(key)} in the checkpoint, "
            f"{want.get(key)} in the model; resuming needs the same model (or "
            "another run_dir)"
        )

    def _set_aside(self, skipped: list[tuple[int, str]]) -> None:
        """Rename checkpoints newer than the restored one that failed, and say so."""
        for step, reason in skipped:
            if self.is_main:
                with interrupt.critical():
                    moved = self.checkpointer.move_aside(step)
                self.reporter.message(
                    f"lemur-train: skipped checkpoint {step} ({reason}); moved to {moved}"
                )
        if skipped and jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("lemur-train: damaged checkpoints set aside")
            self.checkpointer.manager.reload()
