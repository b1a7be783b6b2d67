"""`lemur-data`: build, inspect and verify code-centric token corpora."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from lemur.cli_common import (
    EXIT_USAGE,
    OneLineParser,
    add_debug_option,
    add_set_option,
    debug_wanted,
    die,
    run_main,
    user_input,
)
from lemur.data.work import demo_sources


def _load(args: argparse.Namespace, check_paths: bool = True, write: bool = True):
    """The recipe of the command line, or the demo's; `write=False` creates no file."""
    from lemur.data import demo
    from lemur.data.recipe_loader import (
        apply_overrides,
        check_recipe_paths,
        load_recipe,
        recipe_from_dict,
    )

    if args.recipe:
        # Read once; its paths are checked after the demo conversations it names are written.
        recipe = load_recipe(args.recipe, args.set, check_paths=False)
        if check_paths:
            if write:
                _write_demo_conversations(recipe)
            check_recipe_paths(recipe)
        return recipe
    # The demo's text file lives under its output, so resolve `output` first.
    raw = apply_overrides(demo.demo_recipe(), list(args.set))
    output = raw.get("output", "out/demo")
    if not isinstance(output, str) or not output.strip():
        recipe_from_dict(raw, check_paths=False)  # the one-line error naming `output`
    raw = apply_overrides(demo.demo_recipe(str(output)), list(args.set))
    text_dir = demo_sources(Path(str(output)).expanduser())
    if check_paths and write:
        print(
            "demo: gathering text from man pages, /usr/share/doc and pydoc topics ...",
            file=sys.stderr,
        )
        demo.materialize_text(text_dir)
    elif not (text_dir / "text.jsonl.zst").is_file():
        check_paths = False  # a dry run shows the recipe without gathering its text
    return recipe_from_dict(raw, check_paths=check_paths)


def write_conversations(path: Path, limit: int | None = None, seed: int = 0) -> int:
    """Write the built-in demo conversations to `path` atomically; return how many."""
    from lemur.atomic_files import atomic_open
    from lemur.data.chat_demo import DEFAULT_LIMIT, write_chat_demo

    # A killed run must not leave half a file that a rerun would take as the data. The
    # demo is written by a child process, to the temporary name this handle holds open.
    with atomic_open(path) as fh:
        return write_chat_demo(fh.name, seed, limit or DEFAULT_LIMIT)


def _write_demo_conversations(recipe: Any) -> None:
    """A recipe's `chat.demo_data`: write the demo conversations there unless present."""
    target = recipe.chat.demo_data if recipe.chat is not None else None
    if not target or Path(target).expanduser().is_file():
        return
    print(f"chat demo: writing conversations to {target} ...", file=sys.stderr)
    try:
        write_conversations(Path(target).expanduser())
    except OSError as e:
        die(f"chat.demo_data {target}: {e.strerror or e}")


def cmd_chat_demo_data(args: argparse.Namespace) -> int:
    """Write the demo chat corpus (Python help topics, stdlib docstrings) as messages JSONL."""
    if args.limit is not None and args.limit < 1:
        die(f"--limit {args.limit}: must be >= 1")
    out = Path(args.out).expanduser()
    if out.is_dir():
        die(f"{args.out}: is a directory")
    try:
        n = write_conversations(out, args.limit, args.seed)
    except OSError as e:
        die(f"{args.out}: {e.strerror or e}", 1)
    print(f"wrote {n:,} conversations to {args.out}")
    return 0


def print_plan(plan: dict[str, Any], console: Any) -> None:
    """Print the mix plan: budget, availability and rate per domain and language."""
    from lemur.data.stats import language_rows, print_reading, table

    t = table(
        f"mix plan: {plan['total_tokens']:,} train tokens",
        ["domain / language", "available", "budget", "rate"],
    )
    for label, u in language_rows(plan["languages"]):
        t.add_row(label, f"{u['available']:,}", f"{u['budget']:,}", f"{u['rate']:.4f}")
    console.print(t)
    for note in plan.get("notes", []):
        console.print(f"note: {note}")
    print_reading(plan.get("reading") or {}, console)
    if plan.get("memory"):  # what each global stage's process is expected to hold at its peak
        m = table("expected peak memory per process, above the interpreter", ["stage", "MiB"])
        for stage, n in plan["memory"].items():
            m.add_row(stage, f"{n / 2**20:,.1f}")
        console.print(m)


def print_summary(manifest: dict[str, Any]) -> None:
    """The final table of a build: documents through each stage, tokens per domain."""
    from rich.console import Console
    from rich.table import Table

    from lemur.data.counts import drop_reasons, remote_summary
    from lemur.data.stats import drops_by_source, fim_summary

    c = manifest["counts"]
    mix = manifest["mix"]
    train_docs = sum(s["documents"] for s in manifest["shards"] if s["split"] == "train")
    val_docs = sum(s["documents"] for s in manifest["shards"] if s["split"] == "val")
    t = Table(title="build summary", title_justify="left")
    t.add_column("stage")
    t.add_column("documents", justify="right")
    t.add_column("detail")
    t.add_row("read", f"{c['read']:,}", f"{c['errors_total']:,} bad inputs skipped")
    if c.get("remote"):  # sources in object storage
        t.add_row("remote reading", "", remote_summary(c["remote"]))
    t.add_row(
        "filtered out",
        f"{sum(c['dropped'].values()):,}",
        drop_reasons(c),  # every reason the manifest counts, not the largest few
    )
    for row in drops_by_source(manifest):  # each source, then each domain
        label = (
            f"  {row['source']} ({row['domain']})" if row["source"] else f"  all {row['domain']}"
        )
        t.add_row(label, f"{sum(row['dropped'].values()):,}", drop_reasons(row))
    t.add_row(
        "duplicates",
        f"{c['duplicates']:,}",
        f"exact {c['dedup']['exact']:,}, near {c['dedup']['near']:,}",
    )
    if manifest.get("fim"):
        t.add_row(
            "fill-in-the-middle",
            f"{manifest['fim']['counts']['fim']:,}",
            fim_summary(manifest["fim"]),
        )
    t.add_row("val (held out)", f"{val_docs:,}", "")
    t.add_row("not selected by the mix", f"{mix['unselected_documents']:,}", "")
    t.add_row(
        "train (with repeats)",
        f"{train_docs:,}",
        ", ".join(f"{d} {n:,} tokens ({mix['achieved'][d]:.1%})" for d, n in mix["tokens"].items()),
    )
    Console().print(t)


def cmd_build(args: argparse.Namespace) -> int:
    """Build a corpus from a recipe (or the demo)."""
    from lemur.data.build import UP_TO_DATE, BuildError, build
    from lemur.data.encode.tokenizer import TokenizerError, TokenizerSettingsError
    from lemur.data.pack.write import PackError
    from lemur.progress import Progress

    recipe = _load(args, check_paths=True, write=not args.dry_run)
    if args.dry_run:
        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
        return 0
    up_to_date: list[bool] = []

    def report(stage: str, done: int, total: int) -> None:
        if stage == UP_TO_DATE:  # said once, at the end, with what the output holds
            up_to_date.append(True)
        else:
            progress(stage, done, total)

    try:
        with Progress("lemur-data") as progress:
            manifest = build(
                recipe,
                report=report,
                force=args.force,
                plan_only=args.plan_only,
                on_plan=lambda plan: print_plan(plan, progress.results),
                note=progress.note,
            )
    except (PackError, TokenizerSettingsError) as e:
        die(str(e), EXIT_USAGE)
    except (BuildError, TokenizerError) as e:
        die(str(e), 1)
    except OSError as e:  # anything the up-front checks could not foresee, named
        die(f"{e.filename or recipe.output}: {e.strerror or e}", 1)
    if args.plan_only:
        return 0
    counts = manifest["counts"]
    tokens = manifest["mix"]["tokens"]
    print_summary(manifest)
    if up_to_date:
        print(
            f"nothing written: {recipe.output} already holds this build "
            f"({len(manifest['shards'])} shards); --force rebuilds it"
        )
        return 0
    print(
        f"wrote {len(manifest['shards'])} shards to {recipe.output}: "
        + ", ".join(f"{d} {t:,} tokens" for d, t in tokens.items())
        + f"; read {counts['read']:,} documents, dropped {sum(counts['dropped'].values()):,}, "
        f"skipped {counts['errors_total']:,} bad inputs"
    )
    return 0


def _tokenizer_out(out: str) -> Path:
    """The model file `--out` names: `DIR/tokenizer.model` for a directory; checked up front."""
    from lemur.data.recipe_loader import output_problem

    path = Path(out).expanduser()
    if path.is_dir():
        path = path / "tokenizer.model"
        if path.is_dir():
            die(f"--out {out}: {path} is a directory")
    problem = output_problem(str(path.parent))
    if problem:
        die(f"--out {out}: {path.parent} {problem}")
    return path


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    """Train only the tokenizer of a recipe and write it to --out."""
    from lemur.data.encode.prepare import sample_texts
    from lemur.data.encode.tokenizer import (
        TokenizerError,
        TokenizerSettingsError,
        tokenizer_info,
        train_tokenizer,
    )
    from lemur.data.read.listing import list_inputs
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig, VocabSizeError

    recipe = _load(args)
    config = recipe.tokenizer.train or TokenizerTrainConfig()
    if args.vocab_size is not None:
        try:  # the config checks the bound, as it does the recipe's vocab_size
            config = dataclasses.replace(config, vocab_size=args.vocab_size)
        except VocabSizeError as e:
            die(f"--vocab-size {args.vocab_size}: must be {e.bound}")
    byte_bpe = config.kind == "byte-bpe"  # a folder: tokenizer.json + tokenizer_config.json
    target = Path(args.out).expanduser() if byte_bpe else _tokenizer_out(args.out)
    inputs = list_inputs(recipe).files
    try:
        texts = sample_texts(recipe, inputs, config.sample_bytes)
        if byte_bpe:
            from lemur.data.encode.byte_bpe import train_byte_bpe
            from lemur.tokenizer import open_tokenizer

            out = train_byte_bpe(texts, config, target)
            info = open_tokenizer(out).info()
        else:
            out = train_tokenizer(texts, config, target)
            info = tokenizer_info(out)
    except TokenizerSettingsError as e:
        die(str(e))
    except TokenizerError as e:
        die(str(e), 1)
    except OSError as e:
        die(f"{e.filename or target}: {e.strerror or e}", 1)
    print(f"wrote {out}: vocab {info['vocab_size']}, sha256 {info['sha256'][:16]}...")
    return 0


def cmd_classifier_train(args: argparse.Namespace) -> int:
    """Train a fastText quality classifier on positive and negative documents."""
    from lemur.data.classifier_stage import card_path, train_classifier, training_recipe
    from lemur.data.filter.classifier_train import TrainSettings
    from lemur.data.recipe_loader import load_recipe

    if args.recipe:
        recipe = load_recipe(args.recipe, args.set, check_paths=False)
        positive, negative = args.positive, args.negative
    else:
        recipe = training_recipe(args.positive, args.negative, args.text_key)
        positive, negative = ["positive"], ["negative"]
    settings = TrainSettings(
        **{k: getattr(args, k) for k in TrainSettings.__dataclass_fields__ if k != "newline"},
        newline=args.newline,
    )
    out = Path(args.out).expanduser()
    if out.is_dir():
        die(f"--out {args.out}: is a directory (name the model file, e.g. {out}/quality.bin)")
    try:
        card = train_classifier(recipe, positive, negative, settings, out)
    except OSError as e:
        die(f"{e.filename or out}: {e.strerror or e}", 1)
    m, d = card["metrics"], card["documents"]
    print(
        f"trained on {d['train_positive']:,} positive and {d['train_negative']:,} negative "
        f"documents; held out {d['valid_positive']:,} + {d['valid_negative']:,}"
    )
    if m:
        print(
            f"held-out: precision {m['precision']:.3f}, recall {m['recall']:.3f}, "
            f"F1 {m['f1']:.3f}, AUC {m['auc']:.3f}"
        )
    print(f"wrote {out} and {card_path(out)}")
    return 0


def classifier_parser(sub: Any) -> argparse.ArgumentParser:
    """`lemur-data classifier train`'s arguments (defaults: DCLM's settings)."""
    from lemur.data.filter.classifier_train import TrainSettings

    d = TrainSettings()
    c = sub.add_parser("classifier", help="fastText quality classifiers")
    ct = c.add_subparsers(dest="classifier_command", required=True).add_parser(
        "train", help="train a fastText classifier on positive and negative documents"
    )
    ct.add_argument("--positive", nargs="+", required=True, help="JSONL files (or source names)")
    ct.add_argument("--negative", nargs="+", required=True, help="JSONL files (or source names)")
    ct.add_argument("--recipe", help="take --positive/--negative as this recipe's source names")
    add_set_option(ct, "sources.0.paths=[data/hq.jsonl]")
    ct.add_argument("--text-key", default="text", help="the JSONL field holding the text")
    ct.add_argument("--out", required=True, help="the model file to write (card: .json beside)")
    for flag, key, kind in (
        ("--dim", "dim", int),
        ("--epoch", "epoch", int),
        ("--lr", "lr", float),
        ("--word-ngrams", "word_ngrams", int),
        ("--min-count", "min_count", int),
        ("--bucket", "bucket", int),
        ("--threads", "threads", int),
        ("--seed", "seed", int),
        ("--valid-fraction", "valid_fraction", float),
        ("--label", "positive_label", str),
        ("--negative-label", "negative_label", str),
        ("--newline", "newline", str),
    ):
        ct.add_argument(
            flag, dest=key, type=kind, default=getattr(d, key), help=f"default {getattr(d, key)!r}"
        )
    ct.add_argument("--lowercase", action="store_true", help="lower-case texts (as the stage must)")
    ct.set_defaults(func=cmd_classifier_train)
    return ct


def cmd_stats(args: argparse.Namespace) -> int:
    """Print what a shard directory holds (with `--doc`, where one document came from)."""
    from lemur.data.stats import compute_stats, print_stats, write_plots
    from lemur.shards.format import ShardFormatError

    if args.doc is not None:
        return _stats_doc(args)
    try:
        stats = compute_stats(args.directory)
    except (ShardFormatError, OSError) as e:
        die(str(e))
    try:
        if args.json:
            print(json.dumps(stats, indent=2, sort_keys=True))
        else:
            print_stats(stats)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        # Fields beyond the checked core (mix, counts) written by something else.
        manifest = Path(args.directory) / "manifest.json"
        die(f"{manifest}: unexpected content ({type(e).__name__}: {e}); run `lemur-data verify`")
    if args.plots:
        try:
            written = write_plots(stats, args.plots, args.directory)
        except OSError as e:
            die(f"--plots {args.plots}: {e.strerror or e}")
        for p in written:
            print(f"wrote {p}", file=sys.stderr)
    return 0


def _stats_doc(args: argparse.Namespace) -> int:
    """`stats DIR --doc SHARD:N`: the document's provenance row and first line."""
    from lemur.data.stats import DocumentQueryError, document_info, print_document
    from lemur.shards.format import ShardFormatError

    with user_input(DocumentQueryError, ShardFormatError, OSError):
        info = document_info(args.directory, args.doc)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        print_document(info)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Recompute checksums and check invariants; exit 1 naming each bad file."""
    from lemur.shards.format import ShardFormatError
    from lemur.shards.verify import verify

    try:
        problems = verify(args.directory)
    except ShardFormatError as e:  # no manifest: the wrong directory, exit 2 as for `stats`
        die(str(e))
    except OSError as e:  # a file that exists but cannot be read
        die(f"{e.filename or args.directory}: {e.strerror or e}", 1)
    for p in problems:
        print(f"lemur-data verify: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.directory}: OK")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a shard folder in another trainer's format; print its TRAINING.md."""
    from lemur.export.formats import ExportError
    from lemur.export.run import export
    from lemur.progress import Progress
    from lemur.shards.format import ShardFormatError

    try:
        with Progress("lemur-data", unit="shards") as progress:
            result = export(
                args.directory,
                args.format,
                args.out,
                split=args.split,
                force=args.force,
                report=progress,
            )
    except (ExportError, ShardFormatError) as e:
        die(str(e))
    except OSError as e:
        die(f"{e.filename or args.out}: {e.strerror or e}")
    print(result.training_md)
    print(f"wrote {result.out} ({result.files} files)", file=sys.stderr)
    return 0


def export_parser(sub: Any) -> argparse.ArgumentParser:
    """`lemur-data export DIR --format F --out OUT [--split S] [--force]`."""
    from lemur.export.formats import FORMAT_MODULES

    e = sub.add_parser("export", help="write a shard folder in another trainer's format")
    e.add_argument("directory", help="the lemur shard folder (a build's output)")
    e.add_argument("--format", required=True, choices=list(FORMAT_MODULES))
    e.add_argument("--out", required=True, help="the folder to write (renamed in when complete)")
    e.add_argument("--split", default="all", choices=["train", "val", "all"])
    e.add_argument("--force", action="store_true", help="replace an existing export at --out")
    e.set_defaults(func=cmd_export)
    return e


def _port(text: str) -> int:
    """A TCP port for `--serve` (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535")
    return port


def cmd_inspect(args: argparse.Namespace) -> int:
    """Write the build's inspect page (one offline HTML file); print its path; --serve it."""
    from lemur.cli_common import writing
    from lemur.data.inspect.page import InspectError, gather
    from lemur.data.inspect.render import render, write_page

    out = Path(args.out or Path(args.directory) / "inspect.html").expanduser()
    if out.is_dir():
        die(f"--out {out}: is a directory (name the HTML file to write)")
    try:
        data = gather(args.directory)
    except InspectError as e:
        die(str(e))
    page = render(data)
    with writing(out):
        write_page(out, page)
    print(out, flush=True)
    if args.serve is None:
        return 0
    from lemur.data.inspect.serve import serve

    try:
        return serve(page, args.serve, say=lambda line: print(line, flush=True))
    except OSError as e:  # the port is taken, or not ours to bind
        die(f"--serve {args.serve}: {e.strerror or e}")


def inspect_parser(sub: Any) -> argparse.ArgumentParser:
    """`lemur-data inspect DIR [--out PAGE.html] [--serve [PORT]]`."""
    i = sub.add_parser("inspect", help="write one offline web page showing what a build kept")
    i.add_argument("directory", help="the build's output folder")
    i.add_argument("--out", help="the HTML file to write (default: DIRECTORY/inspect.html)")
    i.add_argument(
        "--serve",
        nargs="?",
        const=8000,
        type=_port,
        metavar="PORT",
        help="also serve the page on 127.0.0.1:PORT (default 8000) until Ctrl-C",
    )
    i.set_defaults(func=cmd_inspect)
    return i


def parser() -> argparse.ArgumentParser:
    """The argument parser of `lemur-data`."""
    p = OneLineParser(prog="lemur-data", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def recipe_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("recipe", nargs="?", help="recipe YAML (default: the built-in demo)")
        add_set_option(q, "mix.ratio.code=8")

    b = sub.add_parser("build", help="build a corpus from a recipe")
    recipe_args(b)
    b.add_argument("--dry-run", action="store_true", help="print the resolved recipe and exit")
    b.add_argument("--force", action="store_true", help="rebuild even if the output is up to date")
    b.add_argument(
        "--plan-only",
        action="store_true",
        help="tokenize and dedup (resumable), print the mix plan, write no shards",
    )
    b.set_defaults(func=cmd_build)

    t = sub.add_parser("tokenizer", help="tokenizer tools")
    tsub = t.add_subparsers(dest="tokenizer_command", required=True)
    tt = tsub.add_parser("train", help="train a SentencePiece model on a recipe's sources")
    recipe_args(tt)
    tt.add_argument(
        "--out", required=True, help="where to write tokenizer.model (byte-bpe: a folder)"
    )
    tt.add_argument("--vocab-size", type=int, default=None)
    tt.set_defaults(func=cmd_tokenizer_train)

    c = sub.add_parser(
        "chat-demo-data", help="write the demo chat corpus (messages JSONL) for a chat build"
    )
    c.add_argument("out", help="the JSONL file to write")
    c.add_argument("--limit", type=int, default=None, help="most conversations (default 3000)")
    c.add_argument("--seed", type=int, default=0, help="seeds the choices and phrasing")
    c.set_defaults(func=cmd_chat_demo_data)

    ct = classifier_parser(sub)

    s = sub.add_parser("stats", help="show what a shard directory holds")
    s.add_argument("directory")
    s.add_argument("--json", action="store_true", help="print JSON instead of tables")
    s.add_argument("--plots", metavar="DIR", help="also write PNG histograms to DIR")
    s.add_argument(
        "--doc",
        metavar="SHARD:N",
        help="where document N of SHARD (train/00003, val/code/00000 or its file's name) "
        "came from: a build with output.provenance",
    )
    s.set_defaults(func=cmd_stats)

    v = sub.add_parser("verify", help="check checksums and invariants of a shard directory")
    v.add_argument("directory")
    v.set_defaults(func=cmd_verify)
    ex = export_parser(sub)
    ins = inspect_parser(sub)
    for q in (p, b, tt, c, s, v, ct, ex, ins):
        add_debug_option(q)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lemur-data`: a mistake exits 2 with one line (SystemExit, as argparse's)."""
    from lemur import process_setup
    from lemur.data.recipe.errors import RecipeError

    process_setup.install("lemur-data")  # every process-wide change: see lemur.process_setup
    args = parser().parse_args(argv)
    return run_main(
        lambda: args.func(args),
        "lemur-data",
        (RecipeError,),
        debug=debug_wanted(args),
        label="error: ",
        interrupted="interrupted; rerun to resume",
        exit_on_error=True,
    )


if __name__ == "__main__":
    sys.exit(main())
