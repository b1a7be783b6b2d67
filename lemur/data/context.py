"""What every stage of one build shares, made once in `build()`: `BuildContext`.

The recipe, the kind of corpus it makes (`Corpus`, asked once), the build's prepared
tokenizer (opened once in this process: `BuildTokenizer`), the work folders and the stage
runner. A stage takes the context and the run it reads (`TokenRun`, lemur/data/runs/) and
returns the run it makes (lemur.data.build's `STAGES`, each a `Stage`); nothing is passed
down by position, and no stage rebuilds what the context holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemur.data.corpus import Corpus, corpus_of
from lemur.data.encode.prepare import tokenizer_key
from lemur.data.recipe.recipe import Recipe
from lemur.data.run.stage import run_tasks
from lemur.data.run.task import Reporter, StageError
from lemur.tokenizer import Tokenizer
from lemur.tokenizer.fim import CodeMarkers


class BuildError(RuntimeError):
    """A build that cannot complete for a reason the user can fix (message says which)."""


@dataclass(frozen=True)
class BuildTokenizer:
    """The build's prepared tokenizer: its file, manifest entry, FIM markers (None without
    FIM) and the tokenizer itself with the recipe's framing, opened once."""

    path: Path
    info: dict[str, Any]
    markers: CodeMarkers | None
    opened: Tokenizer

    @property
    def key(self) -> str:
        """What the build's token runs depend on of it (`tokenizer_key` of its entry)."""
        return tokenizer_key(self.info)


@dataclass(frozen=True)
class BuildContext:
    """One build's shared state: made once in `build()`, handed to every stage."""

    recipe: Recipe
    corpus: Corpus
    out: Path
    report: Reporter
    note: Callable[[str], None]
    plan_only: bool = False  # end the build with the mix plan, no shards written
    on_plan: Callable[[dict[str, Any]], None] | None = None  # told the plan before packing
    tokenizer: BuildTokenizer | None = None  # set once the tokenizer is prepared

    @classmethod
    def of(
        cls,
        recipe: Recipe,
        out: Path,
        report: Reporter,
        note: Callable[[str], None],
        plan_only: bool = False,
        on_plan: Callable[[dict[str, Any]], None] | None = None,
    ) -> BuildContext:
        """The context of a build of `recipe` into `out` (the one place the corpus is made)."""
        return cls(recipe, corpus_of(recipe), out, report, note, plan_only, on_plan)

    @property
    def work_root(self) -> Path:
        """The build's work folder (`<output>/.work`, or the recipe's `work_dir`)."""
        return self.recipe.work_root()

    @property
    def tok(self) -> BuildTokenizer:
        """The prepared tokenizer (a stage after preparation asks; never None there)."""
        assert self.tokenizer is not None, "the build's tokenizer is not prepared yet"
        return self.tokenizer

    def with_tokenizer(self, tokenizer: BuildTokenizer) -> BuildContext:
        """This context once the tokenizer is prepared."""
        return dataclasses.replace(self, tokenizer=tokenizer)

    def stage(self, pipeline: list, folder: Path, tasks: int, name: str) -> None:
        """Run `tasks` tasks of a pipeline on the recipe's executor (logs under
        `folder/logs`); a failed stage is a BuildError naming it."""
        try:
            run_tasks(self.recipe.executor, pipeline, folder, tasks, name, self.report)
        except StageError as e:
            raise BuildError(str(e)) from None
