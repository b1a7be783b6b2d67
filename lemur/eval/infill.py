"""Infilling (fill-in-the-middle) evaluation: HumanEval-infilling's way, on the model's own
FIM prompt.

Each task's prefix and suffix become the model's FIM prompt (lemur.tokenizer.fim: the same
tokens as the build's FIM documents, PSM or SPM); the model writes the middle, greedy or
sampled (lemur.eval.generate), until one of its end markers (its EOS or end of turn, its
FIM end-of-text, or any FIM, repository or file-separator marker: what would begin the next
document); the middle is spliced in, `prompt + middle + suffix + "\\n" + test + "\\n" +
check(entry_point)`, and run in the sandbox exactly as `humaneval` runs a program
(lemur.eval.humaneval.check). pass@k is the unbiased estimator of Chen et al. (2021); exact
match compares the middle with the reference after stripping whitespace at both ends (the
bigcode harness's FIM exact match).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lemur.eval import humaneval
from lemur.eval.infill_tasks import InfillTask
from lemur.eval.long_prompts import LongPrompts, fit
from lemur.plots import pyplot, save_figure
from lemur.tokenizer.fim import CodeMarkers, fim_prompt_ids

# Reference middles grouped by length in lines, for the report and the plot.
LINE_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 9), (10, None))


def middle_lines(middle: str) -> int:
    """Lines a middle spans (a trailing newline ends its last line; it starts none)."""
    return middle.count("\n") + (0 if middle.endswith("\n") else 1)


def exact_match(completion: str, reference: str | None) -> bool | None:
    """The completion equals the reference middle up to whitespace at both ends (None: the
    task has no reference)."""
    return None if reference is None else completion.strip() == reference.strip()


def check(
    tasks: Sequence[InfillTask],
    samples: Sequence[tuple[str, str]],
    limits: Any = None,
    *,
    workers: int | None = None,
    allow_network: bool = False,
    progress: Callable[[int, int], None] | None = None,
    checked: dict[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run every (task_id, middle) spliced into its task in the sandbox; one record per
    sample, in order: humaneval.check's fields (`completion` is the middle) plus
    `exact_match` and the reference's `middle_lines` (`annotate`). `checked` as in
    humaneval.check (its records not annotated yet)."""
    by_id = {t.task_id: t for t in tasks}
    # humaneval's program is prompt + completion + "\n" + test + ...: the completion
    # `middle + suffix` makes it human-eval-infilling's program.
    records = humaneval.check(
        [t.as_humaneval() for t in tasks],
        [(i, middle + by_id[i].suffix) for i, middle in samples],
        limits,
        workers=workers,
        allow_network=allow_network,
        progress=progress,
        checked=checked,
    )
    return annotate(tasks, samples, dict(enumerate(records)))


def annotate(
    tasks: Sequence[InfillTask],
    samples: Sequence[tuple[str, str]],
    checked: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The checked records (sample index -> humaneval.check's record) in sample order, each
    with the middle as `completion`, `exact_match` and the reference's `middle_lines`."""
    by_id = {t.task_id: t for t in tasks}
    records = []
    for index in sorted(checked):
        record, (task_id, middle) = checked[index], samples[index]
        reference = by_id[task_id].middle
        record["completion"] = middle
        record["exact_match"] = exact_match(middle, reference)
        record["middle_lines"] = None if reference is None else middle_lines(reference)
        records.append(record)
    return records


def _bucket_name(low: int, high: int | None) -> str:
    """A LINE_BUCKETS entry as a label: "1", "4-5", "10+"."""
    return f"{low}+" if high is None else str(low) if low == high else f"{low}-{high}"


def by_middle_lines(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Samples, pass rate and exact-match rate per length of the reference middle."""
    out = {}
    for low, high in LINE_BUCKETS:
        inside = [
            r
            for r in records
            if r.get("middle_lines") is not None
            and low <= r["middle_lines"] <= (high or r["middle_lines"])
        ]
        if inside:
            out[_bucket_name(low, high)] = {
                "samples": len(inside),
                "pass_rate": float(np.mean([r["passed"] for r in inside])),
                "exact_match": float(np.mean([bool(r["exact_match"]) for r in inside])),
            }
    return out


def summarize(records: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """humaneval.summarize's pass@k and counts, the exact-match rate over samples whose task
    has a reference middle, and both by the reference's length in lines."""
    matched = [r["exact_match"] for r in records if r.get("exact_match") is not None]
    return {
        **humaneval.summarize(records, ks),
        "exact_match": float(np.mean(matched)) if matched else None,
        "by_middle_lines": by_middle_lines(records),
    }


def plot(summary: dict[str, Any], out: str | os.PathLike[str]) -> Path:
    """A PNG of pass rate and exact match by the reference middle's length in lines."""
    plt = pyplot()

    groups = summary["by_middle_lines"]
    names = list(groups)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(6, 4))
    for offset, key, label in ((-0.2, "pass_rate", "tests pass"), (0.2, "exact_match", "exact")):
        ax.bar(x + offset, [100 * groups[n][key] for n in names], width=0.4, label=label)
    ax.set_xticks(x, [f"{n}\n({groups[n]['samples']})" for n in names])
    ax.set_xlim(-0.7, max(len(names), 3) - 0.3)  # one group's bars stay bars, not slabs
    ax.set(xlabel="reference middle, lines (samples)", ylabel="% of samples", ylim=(0, 100))
    ax.set_title(f"{summary.get('tasks_source', 'infilling')}, {summary.get('mode', '')}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, out, dpi=110)


def canonical_samples(tasks: Sequence[InfillTask]) -> list[tuple[str, str]]:
    """(task_id, reference middle) of every task (ValueError naming how many have none)."""
    missing = [t.task_id for t in tasks if t.middle is None]
    if missing:
        raise ValueError(f"{len(missing)} tasks have no canonical_solution (e.g. {missing[0]})")
    return [(t.task_id, t.middle) for t in tasks if t.middle is not None]


@dataclasses.dataclass(frozen=True)
class FimPrompter:
    """A model's FIM prompt and where its middles end: `markers` from
    lemur.tokenizer.fim.find_code_markers, `spm` the suffix-prefix-middle order."""

    tokenizer: Any
    markers: CodeMarkers
    spm: bool = False

    def prompt_ids(self, task: InfillTask) -> list[int]:
        """The prompt's ids: the build's FIM document of the task (after the model's BOS, if
        it has one) up to where its middle starts."""
        return fim_prompt_ids(self.tokenizer, self.markers, task.prompt, task.suffix, spm=self.spm)

    def end_ids(self) -> tuple[int, ...]:
        """The ids a middle ends at: the tokenizer's stop ids (EOS, end of turn) and every
        marker id (`<EOT>`, and a FIM, repository or file marker: the next document's)."""
        return tuple(dict.fromkeys(int(i) for i in (*self.tokenizer.stop_ids, *self.markers.ids)))


def complete(
    params: Any,
    config: Any,
    prompter: FimPrompter,
    tasks: Sequence[InfillTask],
    n: int,
    gen: Any,
    *,
    long_prompts: str = "refuse",
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[str, str]], LongPrompts]:
    """n middles per task from the model: (task_id, middle) in task order, each cut at the
    first end marker (and `gen.stop`); and what was done to prompts longer than the
    context (`long_prompts` "refuse": a UserError naming the first; "skip": those tasks
    have no sample)."""
    from lemur.eval.generate import generate_ids

    ids = [t.task_id for t in tasks]
    kept, prompts, long = fit(
        ids, [prompter.prompt_ids(t) for t in tasks], config.max_seq_len, long_prompts, ("skip",)
    )
    completions = generate_ids(
        params,
        config,
        [p for p in prompts for _ in range(n)],
        gen,
        eos_id=prompter.end_ids(),
        tokenizer=prompter.tokenizer,
        progress=progress,
    )
    ids = [ids[i] for i in kept for _ in range(n)]
    return [(i, c.text) for i, c in zip(ids, completions, strict=True)], long
