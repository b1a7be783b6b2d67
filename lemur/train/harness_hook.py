"""The training loop's lm-evaluation-harness hook: `eval.harness` tasks on the live params.

Every `eval.harness.every` steps (and at the last step) the loop calls the hook with the
state it just stepped; the hook runs `lm_eval.simple_evaluate` with
lemur.model.harness_lm's model over those params (no checkpoint round trip: the arrays
the step produced, sharded as they are), the run's tokenizer (the one of its first data
directory, which every directory shares) and the model config, and emits one record to the
run's metrics JSONL beside the eval losses:

    {"step": 200, "harness/lemur_code_mc/acc": 0.25, "harness/lemur_code_mc/acc_stderr":
     0.13, ..., "harness_s": 4.1}

Metric keys drop lm-eval's filter suffix when it is `none` (`acc,none` -> `acc`) and keep
it otherwise (`exact_match,strict-match` -> `exact_match/strict-match`). The task list is
checked when the run starts (a missing lm_eval, a missing --include-path, an unknown task:
one line, before any step), so a typo does not cost the steps before the first eval.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from lemur.model.config import LlamaConfig
from lemur.model.harness_lm import HarnessMissing, harness_lm, lm_eval_module
from lemur.tokenizer import Tokenizer
from lemur.train.config import HarnessEvalConfig
from lemur.train.errors import RunError


def metric_key(task: str, metric: str) -> str:
    """`harness/<task>/<metric>` of lm-eval's `metric,filter` result key."""
    name, _, filt = metric.partition(",")
    return f"harness/{task}/{name}" + ("" if filt in ("", "none") else f"/{filt}")


def flatten(results: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of lm-eval's `results` section as `metric_key`s (alias and
    sample counts left out; an `N/A` stderr too)."""
    out = {}
    for task, metrics in results.items():
        for metric, value in metrics.items():
            if "," not in metric or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                out[metric_key(task, metric)] = float(value)
    return out


class HarnessHook:
    """Runs the configured tasks on a state's params and emits their metrics."""

    def __init__(
        self,
        settings: HarnessEvalConfig,
        model: LlamaConfig,
        tokenizer: Tokenizer,
        emit: Any,
        seed: int = 0,
    ) -> None:
        self.settings, self.model, self.tokenizer, self.emit = settings, model, tokenizer, emit
        self.seed = seed
        self.manager = _task_manager(settings)
        self.last: dict[str, float] = {}

    def __call__(self, info: Any) -> None:
        """Evaluate `info.state`'s params (the loop's hook entry)."""
        self.record(info.step, info.state["params"])

    def record(self, step: int, params: Any) -> dict[str, float]:
        """Run the tasks on `params`, emit the record of `step`, return its metrics."""
        from lm_eval import simple_evaluate

        t = time.perf_counter()
        lm = harness_lm(
            self.model, params, self.tokenizer, batch_size=self.settings.batch_size, seed=self.seed
        )
        results = simple_evaluate(
            model=lm,
            tasks=list(self.settings.tasks),
            num_fewshot=self.settings.num_fewshot,
            limit=self.settings.limit,
            task_manager=self.manager,
            log_samples=False,
        )
        self.last = flatten(results["results"]) if results is not None else {}
        self.emit({"step": step, **self.last, "harness_s": time.perf_counter() - t})
        return self.last


def _task_manager(settings: HarnessEvalConfig) -> Any:
    """lm-eval's TaskManager with the include path, every task name checked (RunError)."""
    try:
        lm_eval_module()
    except HarnessMissing as e:
        raise RunError(f"eval.harness: {e}") from None
    from lm_eval.tasks import TaskManager

    include = settings.include_path
    if include is not None and not Path(include).is_dir():
        raise RunError(f"eval.harness.include_path: {include}: no such directory")
    manager = TaskManager(include_path=include)
    unknown = [t for t in settings.tasks if not manager.match_tasks([t])]
    if unknown:
        raise RunError(
            f"eval.harness.tasks: unknown task {', '.join(unknown)} (lm-eval's tasks"
            + (f" plus {include})" if include else ")")
        )
    return manager
