"""Every folder and file of a build's work directory, named here and nowhere else.

The work directory is `recipe.work_root()`: `<output>/.work`, or the recipe's `work_dir`,
which builds into other outputs may share. Under it:

    tokens-<key>/          a tokenize run of the build's inputs, keyed by recipe, inputs and
        tokens/            tokenizer: its token runs (TokenizeWriter, DedupSigner),
        errors/            the bad inputs the reader recorded,
        samples/           with `inspect:`, each step's part file per task (samples/collect.py),
        dedup-<key>/       and the dedup stages over those runs (dedup/stage.py),
        fim-<key>/         the FIM stage's rewritten runs (fim/rewrite.py);
        repos-spill/       with `repos:`, the files each task set aside by repository bucket,
        repos-<key>/       and the repository documents' token runs (repos/group.py)
    sample-<key>/          a tokenize run of a sample (the ratio sweep), laid out the same
    shuffle-<key>/         a pack stage's histograms, scatter and gather (pack/write.py);
                           `finished_shuffles` lists them for commit() once the manifest is in
    listing-<key>.json     a remote source's listing, made once (read/remote_listing.py)
    tokenizer-<sha>.model, given-tokenizer-<sha>[-chatml|-fim].model, hf-tokenizer-<sha>/,
    byte-bpe-<sha>/        the prepared tokenizers (tokenize/prepare.py)
    decontam/              the benchmark n-gram indexes (filter/decontaminate.py)
    quality-<name>-<key>/  a classifier's cached scores, by model and text normalisation:
                           one file per tokenize task and one of the keep_top sample
                           (filter/classifier.py, classifier_stage.py)

The demo's gathered text lives under `<output>/.work/demo-sources/` (`demo_sources`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TOKENS, ERRORS, SAMPLES = "tokens", "errors", "samples"


def tokenize_run(root: Path, kind: str, key: str) -> Path:
    """The folder of a tokenize run: `tokens-<key>` for the inputs (`kind` "read"), else
    `<kind>-<key>` (a sample)."""
    return root / f"{'tokens' if kind == 'read' else kind}-{key}"


def run_key(run: Path) -> str:
    """The key a tokenize run of the inputs is named by (`tokenize_run`)."""
    return run.name.removeprefix("tokens-")


def tokens_dir(run: Path) -> Path:
    """Where a tokenize run's token files lie."""
    return run / TOKENS


def errors_dir(run: Path) -> Path:
    """Where a tokenize run's reader records its bad inputs."""
    return run / ERRORS


def samples_parts(run: Path) -> Path:
    """Where a tokenize run's steps write their samples, one folder per step."""
    return run / SAMPLES


def dedup_folder(run: Path, key: str) -> Path:
    """The dedup stages' folder for one dedup config (`key`), beside the run they read."""
    return run / f"dedup-{key}"


def fim_folder(run: Path, key: str) -> Path:
    """The FIM stage's folder for one FIM setting (`key`), beside the run it rewrites."""
    return run / f"fim-{key}"


def repos_spill(run: Path) -> Path:
    """Where a tokenize run's tasks set aside the files of repositories (repos/spill.py)."""
    return run / "repos-spill"


def repos_run(run: Path, key: str) -> Path:
    """The group stage's run beside the tokenize run it regroups (laid out as one: its
    `tokens_dir` holds token runs the pack stage reads)."""
    return run / f"repos-{key}"


def shuffle_folder(root: Path, key: str) -> Path:
    """A pack stage's folder: removed by commit() once the build's manifest is written."""
    return root / f"shuffle-{key}"


def finished_shuffles(root: Path) -> list[Path]:
    """Every pack stage's folder under `root` (the build holds the work directory's lock)."""
    return sorted(root.glob("shuffle-*"))


def trained_tokenizer(root: Path, key: str) -> Path:
    """A SentencePiece model trained by the build."""
    return root / f"tokenizer-{key}.model"


def given_tokenizer(root: Path, sha: str, chat: bool, fim: bool = False) -> Path:
    """The recipe's given SentencePiece model (with the ChatML markers for a chat build, the
    FIM pieces for a FIM build)."""
    return root / f"given-tokenizer-{sha}{'-chatml' if chat else ''}{'-fim' if fim else ''}.model"


def hf_tokenizer(root: Path, key: str) -> Path:
    """A copy of the recipe's tokenizer.json folder."""
    return root / f"hf-tokenizer-{key}"


def byte_bpe(root: Path, key: str) -> Path:
    """A byte-level BPE tokenizer.json folder trained by the build."""
    return root / f"byte-bpe-{key}"


def decontam(root: Path) -> Path:
    """The benchmark n-gram indexes of decontamination."""
    return root / "decontam"


def quality_cache(root: Path, name: str, key: str) -> Path:
    """The cached scores of the classifier `name` (`key`: its model and normalisation)."""
    return root / f"quality-{name}-{key}"


def quality_run(run: Path) -> Path:
    """A tokenize run's classifier records: the cuts and each task's summary."""
    return run / "quality"


def demo_sources(output: str | os.PathLike[str]) -> Path:
    """The demo's gathered text files, under its output's own work directory."""
    return Path(output) / ".work" / "demo-sources"


def listing_record(root: Path, key: str) -> Path:
    """A remote source's listing, recorded once per build (read/remote_listing.py)."""
    return root / f"listing-{key}.json"


def completion_marker(stage: Path, rank: int) -> Path:
    """datatrove's marker of task `rank` done, of a stage logging under `stage/logs`: a rerun
    skips the tasks that have one."""
    return stage / "logs" / "completions" / f"{rank:05d}"


def settings_sha(obj: object) -> str:
    """The sha256 (hex) of settings as sorted JSON: what names a work folder or a build's
    own directory by content (any change to the settings moves it)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
