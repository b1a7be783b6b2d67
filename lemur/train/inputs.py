"""The run's data: the train loader and eval streams, checked against the model, and evals."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lemur.shards.format import ShardFormatError
from lemur.tokenizer.token_bytes import bits_per_byte
from lemur.train import mesh as mesh_lib
from lemur.train.eval_stream import EvalStream, make_eval_iterators
from lemur.train.setup import (
    RunError,
    sum_over_processes,
)
from lemur.train.train_stream import make_train_iterator


class Inputs:
    """The `Trainer` methods that open its data and score the eval streams."""

    def _make_loader(self) -> Any:
        """This process's stream of per-host batches, checked against the model."""
        data = self.config.data
        weights = data.weights or [1.0] * len(data.dirs)
        try:
            return make_train_iterator(
                [(self.data_dirs[d], w) for d, w in zip(data.dirs, weights, strict=True)],
                seq_len=self.config.batch.seq_len,
                batch_size=self.host.rows,
                seed=self.config.data_seed,
                process_index=self.host.index,
                process_count=self.host.count,
                num_workers=data.num_workers,
                num_threads=data.num_threads,
                prefetch=data.prefetch,
                vocab_size=self.data_vocab,
                tokenizer_sha256=self.tokenizer_sha,
                strict_state=data.strict_state,
            )
        except (ShardFormatError, OSError, ValueError) as e:
            raise RunError(str(e).splitlines()[0]) from None

    def _make_evals(self) -> dict[str, EvalStream]:
        """One stream per val domain of the eval directories (`code`, `text`, ...)."""
        dirs = self.config.data.eval_dirs or self.config.data.dirs
        shape = (self.config.eval_batch_size, self.config.batch.seq_len)
        self.eval_sharding = mesh_lib.batch_sharding(self.mesh, *shape)
        self.eval_shape = shape
        host = mesh_lib.host_slice(self.eval_sharding, shape)
        streams: dict[str, EvalStream] = {}
        for d in dirs:
            try:
                shard_dir = self.data_dirs[d]
                # Checked once per directory: a train directory's checks are not redone.
                shard_dir.check_compatible(
                    vocab_size=self.data_vocab, tokenizer_sha256=self.tokenizer_sha
                )
                found = make_eval_iterators(
                    shard_dir,
                    seq_len=self.config.batch.seq_len,
                    batch_size=host.rows,
                    max_batches=self.config.eval.batches,
                    process_index=host.index,
                    process_count=host.count,
                    vocab_size=self.data_vocab,
                )
            except (ShardFormatError, OSError, ValueError) as e:
                raise RunError(str(e).splitlines()[0]) from None
            for domain, stream in found.items():
                # Two directories with the same val domain: tell them apart by directory.
                name = domain if domain not in streams else f"{domain}@{Path(d).name}"
                streams[name] = stream
        return streams

    def evaluate(self, params: Any) -> dict[str, tuple[float, float]]:
        """(mean loss per valid token, bits per byte) of each val domain."""
        results = {}
        for name, stream in self.evals.items():
            parts, n_bytes = [], 0
            try:
                for local in stream:
                    n_bytes += self.token_bytes.batch_bytes(local)  # this host's rows
                    parts.append(
                        self.eval_step(
                            params,
                            mesh_lib.global_batch(local, self.eval_sharding, self.eval_shape),
                        )
                    )
            except ShardFormatError as e:  # an id outside the vocabulary, found on reading
                raise RunError(f"eval {name}: {str(e).splitlines()[0]}") from None
            sums = np.asarray(jax.device_get(parts), np.float64).reshape(-1, 2).sum(0)
            n_bytes = sum_over_processes(n_bytes)
            results[name] = (
                float(sums[0] / max(sums[1], 1.0)),
                bits_per_byte(float(sums[0]), n_bytes),
            )
        return results

    def _eval_record(self, step: int, params: Any) -> dict[str, float]:
        t = time.perf_counter()
        evals = self.evaluate(params)
        record: dict[str, Any] = {"step": step}
        for name, (loss, bpb) in evals.items():
            record[f"eval/{name}/loss"] = loss
            record[f"eval/{name}/ppl"] = math.exp(min(loss, 80.0))
            record[f"eval/{name}/bpb"] = bpb
        record["eval_s"] = time.perf_counter() - t
        self._emit(record)
        return {name: loss for name, (loss, _) in evals.items()}
