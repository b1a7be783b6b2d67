"""Preparing a build's tokenizer under `<output>/.work/`: copied, extended or trained."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loguru import logger

from lemur.atomic_files import temp_name
from lemur.chat_template import ChatTemplate, template_source
from lemur.chat_template.template import TEMPLATE_FILE
from lemur.data import work as work_folders
from lemur.data.corpus import Corpus
from lemur.data.encode.byte_bpe import train_byte_bpe
from lemur.data.encode.tokenizer import (
    TokenizerError,
    extend_tokenizer,
    load_llama2_processor,
    tokenizer_info,
    train_tokenizer,
)
from lemur.data.read.listing import InputFile
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.recipe import Recipe
from lemur.shards.format import ShardFormatError, atomic_write_bytes, read_manifest
from lemur.tokenizer import (
    SentencePieceTokenizer,
    Tokenizer,
    is_tokenizer_json,
    open_tokenizer,
    read_hf_tokenizer,
)
from lemur.tokenizer.fim import FIM_PIECES, MARKER_STYLES, CodeMarkers, find_code_markers
from lemur.tokenizer.hf_files import CONFIG_FILES, tokenizer_json_path
from lemur.tokenizer.round_trip import round_trip_problem

# Part of a trained tokenizer's file name key (the build's WORK_VERSION when it was set).
KEY_VERSION = 2
# The marker tokens a FIM build's trained byte-level BPE gets (Qwen2.5-Coder's names).
BYTE_BPE_MARKERS = tuple(MARKER_STYLES["qwen2.5-coder"].values())


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ordered(files: list[InputFile]) -> list[InputFile]:
    """Files in a seed-free pseudo-random order, so a sample spans the whole source.

    The order hashes the path relative to the source root (and a part's offset), never the
    absolute path: the same corpus under another folder or mount point must sample the same
    text and so train the same tokenizer.
    """

    def key(f: InputFile) -> bytes:
        return hashlib.blake2b(f"{f.rel}\0{f.start}".encode(), digest_size=8).digest()

    return sorted(files, key=key)


def sample_texts(recipe: Recipe, inputs: list[InputFile], budget: int) -> Iterator[str]:
    """A deterministic sample of about `budget` bytes of text, split evenly over sources."""
    reader = SourcesReader(inputs, recipe.sources, errors_dir="")
    per_source = max(1, budget // len(recipe.sources))
    for i in range(len(recipe.sources)):
        taken = 0
        for f in _ordered([f for f in inputs if f.source == i]):
            for doc in reader.read(f):
                if doc.text.strip():
                    taken += len(doc.text.encode("utf-8", "surrogatepass"))
                    yield doc.text
                if taken >= per_source:
                    break
            if taken >= per_source:
                break


def given_model(path: str) -> Path:
    """The model file a recipe's `tokenizer.model` names: the file, or a shard directory's.

    A shard directory (e.g. `out/demo` after `make demo`) lends the tokenizer its manifest
    names, so a chat corpus can share the ids of the model trained on that directory.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        try:
            return p / str(read_manifest(p)["tokenizer"]["file"])
        except (ShardFormatError, KeyError, TypeError) as e:
            raise TokenizerError(f"{p}: not a shard directory with a tokenizer ({e})") from None
    return p


HF_FILES = ("tokenizer.json", *CONFIG_FILES, TEMPLATE_FILE)


def check_given_tokenizer(recipe: Recipe) -> None:
    """A TokenizerError naming the file if the recipe's given tokenizer (`model` or `hf`)
    cannot frame this build's documents or loses text (`round_trip_problem`), unless
    `lossy: allow`; a RecipeError if a FIM build's markers cannot be what it names or
    finds (`check_fim_markers`). Cheap: a few milliseconds once the file is loaded, and
    loading is cached per process (tiktoken's plan is left to the build when `engine` is
    `auto`)."""
    cfg = recipe.tokenizer
    if cfg.hf is not None:
        file = tokenizer_json_path(cfg.hf)
        read_hf_tokenizer(file)  # a SentencePiece model given as `hf` is named as such
        engine = "tiktoken" if cfg.engine == "tiktoken" else "tokenizers"
        tok = _open_hf(recipe, file, engine)
    elif cfg.model is not None:
        file = given_model(cfg.model)
        load_llama2_processor(file)  # Llama-2's <unk>/<s>/</s> ids, as every build's model has
        tok = SentencePieceTokenizer(file)
    else:
        check_fim_markers(recipe, None, "")
        return
    problem = None if cfg.lossy == "allow" else round_trip_problem(tok)
    if problem:
        raise TokenizerError(
            f"{file}: loses text, {problem}; a pre-training tokenizer must give back what it "
            "encodes (set tokenizer.lossy: allow to take it anyway)"
        )
    check_fim_markers(recipe, tok, file)


def check_fim_markers(recipe: Recipe, tok: Tokenizer | None, file: str | Path) -> None:
    """A RecipeError naming `fim.markers` (and the tokenizer `file`) unless a FIM build's
    markers will be found: in the given tokenizer `tok` (None: the build trains one), whose
    markers must be tokens no text encodes to, distinct, and neither BOS nor EOS. Before
    the build makes anything: a refused build leaves nothing behind."""
    fim = recipe.fim
    if fim is None or appends_fim_pieces(recipe):  # CodeLlama's pieces, appended as controls
        return
    if tok is None:  # trained: SentencePiece gets CodeLlama's pieces, byte-level BPE Qwen's
        byte_bpe = recipe.tokenizer.train.kind == "byte-bpe"
        if byte_bpe and set((fim.markers or {}).values()) <= set(BYTE_BPE_MARKERS):
            return
        raise RecipeError(
            f"recipe: fim.markers: a trained tokenizer has only its own FIM tokens "
            f"({', '.join(BYTE_BPE_MARKERS if byte_bpe else FIM_PIECES)}): leave fim.markers "
            "out, or name the tokens of a given tokenizer.model or tokenizer.hf"
        )
    build_markers(recipe, file, tok)


def build_markers(recipe: Recipe, path: Path | str, tok: Tokenizer | None = None) -> CodeMarkers:
    """The FIM build's markers in its prepared tokenizer at `path` (`tok`, if open already):
    `fim.markers`' names, else the tokenizer's own (a known family's); a RecipeError naming
    the file and what to set otherwise."""
    assert recipe.fim is not None
    tok = tok if tok is not None else open_build_tokenizer(recipe, Path(path))
    where = recipe.tokenizer.hf or path
    try:
        markers = find_code_markers(tok, recipe.fim.markers)
    except TokenizerError as e:
        raise RecipeError(f"recipe: {where}: {e}") from None
    if markers is None:
        raise RecipeError(
            f"recipe: {where}: no FIM tokens of a known code model "
            f"({', '.join(MARKER_STYLES)}): name the model's with fim.markers "
            "(prefix, middle, suffix)"
        )
    framing = {tok.bos_id: "BOS", tok.eos_id: "EOS"}
    taken = [i for i in markers.ids if i in framing or markers.ids.count(i) > 1]
    if taken:
        what = framing.get(taken[0], "another marker")
        raise RecipeError(
            f"recipe: fim.markers: id {taken[0]} is the tokenizer's {what} as well: "
            "each marker must be a token of its own"
        )
    return markers


def copy_hf_tokenizer(src: str, work: Path, chat: bool = False) -> Path:
    """A recipe's `tokenizer.hf` copied under `work/` (tokenizer.json and its config files).

    Checked first: a tokenizer.json that `tokenizers` cannot load is a TokenizerError
    naming it, and for a chat build (`chat`) so is a folder without a chat template, or
    one whose rendered text this engine does not encode as transformers does. The copy
    is named by the hash of all its files (a new template is a new copy), appears whole.
    """
    files = read_hf_tokenizer(src)
    tok = open_tokenizer(files.path)  # loads (and so validates) before anything is copied
    if chat:
        ChatTemplate(tok).check()
    present = [n for n in HF_FILES if (files.path.parent / n).is_file()]
    # Named by every file's content: a changed tokenizer_config.json (BOS/EOS, chat
    # template) or chat_template.jinja is another copy.
    key = _sha([files.sha256] + [(n, _file_sha(files.path.parent / n)) for n in present[1:]])
    target = work_folders.hf_tokenizer(work, key[:16])
    if not (target / "tokenizer.json").is_file():
        tmp = temp_name(target)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in present:
            shutil.copyfile(files.path.parent / name, tmp / name)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target / "tokenizer.json"


def prepare_tokenizer(recipe: Recipe, corpus: Corpus, inputs: list[InputFile], work: Path) -> Path:
    """The recipe's tokenizer as a checked file under `<output>/.work/` (copied or trained).

    A given model is checked first (`check_given_tokenizer`, which `build` runs before it
    makes the output directory), and nothing goes outside `.work/` here: the build's own
    directory receives it only when complete. A chat build's SentencePiece tokenizer has
    the ChatML markers as user-defined pieces: trained in, or appended to a given model
    (every other id unchanged); a tokenizer.json's chat build renders with the folder's
    own chat template instead.
    """
    pieces = corpus.tokenizer_pieces()  # ChatML's markers for a ChatML chat build
    if recipe.tokenizer.hf is not None:
        return copy_hf_tokenizer(recipe.tokenizer.hf, work, corpus.chat_format == "template")
    fim = appends_fim_pieces(recipe)
    if recipe.tokenizer.model is not None:
        src = given_model(recipe.tokenizer.model)
        sha = tokenizer_info(src)["sha256"]  # TokenizerError naming `src` if unusable
        target = work_folders.given_tokenizer(work, sha[:16], bool(pieces), fim)
        if not target.is_file():
            if pieces or fim:
                extend_tokenizer(src, pieces, target, _fim_pieces(fim))
            else:
                atomic_write_bytes(target, src.read_bytes())
        return target
    train = recipe.tokenizer.train
    what: dict[str, Any] = {"train": train, "sources": recipe.sources, "v": KEY_VERSION}
    if recipe.fim is not None:  # FIM builds' trained tokenizers hold the markers
        what["fim"] = FIM_PIECES if train.kind != "byte-bpe" else BYTE_BPE_MARKERS
    if train.kind == "byte-bpe":
        if pieces:
            raise TokenizerError(
                "recipe: tokenizer.train.kind byte-bpe: chat builds need a SentencePiece "
                "tokenizer (ChatML) or a given tokenizer.json with its chat template"
            )
        folder = work_folders.byte_bpe(work, _sha(what)[:16])
        if not (folder / "tokenizer.json").is_file():
            specials = BYTE_BPE_MARKERS if recipe.fim is not None else ()
            texts = sample_texts(recipe, inputs, train.sample_bytes)
            train_byte_bpe(texts, train, folder, specials)
        return folder / "tokenizer.json"
    if pieces:
        what["symbols"] = pieces
    target = work_folders.trained_tokenizer(work, _sha(what)[:16])
    if not target.is_file():
        texts = sample_texts(recipe, inputs, train.sample_bytes)
        # The FIM pieces are appended after training, to a model of its own name.
        base = target.with_name(f"{target.stem}-base.model") if fim else target
        train_tokenizer(texts, train, base, pieces)
        if fim:
            extend_tokenizer(base, (), target, FIM_PIECES)
            base.unlink(missing_ok=True)
    return target


def appends_fim_pieces(recipe: Recipe) -> bool:
    """Whether the build appends CodeLlama's FIM pieces to its SentencePiece model: a FIM
    build's given or trained model, unless the recipe names the markers it already has."""
    fim = recipe.fim
    sentencepiece = recipe.tokenizer.hf is None and (
        recipe.tokenizer.model is not None or recipe.tokenizer.train.kind != "byte-bpe"
    )
    return fim is not None and not fim.markers and sentencepiece


def _fim_pieces(fim: bool) -> tuple[str, ...]:
    return FIM_PIECES if fim else ()


def open_build_tokenizer(recipe: Recipe, path: Path) -> Tokenizer:
    """The prepared tokenizer with the recipe's framing settings (BOS/EOS, engine)."""
    if recipe.tokenizer.hf is None:  # SentencePiece, or a trained byte-level BPE: its own framing
        return open_tokenizer(path)
    return _open_hf(recipe, path, recipe.tokenizer.engine or "auto")


def _open_hf(recipe: Recipe, path: Path, engine: str) -> Tokenizer:
    """The recipe's `hf` tokenizer at `path` with its framing settings, an EOS required."""
    cfg = recipe.tokenizer
    tok = open_tokenizer(path, bos=cfg.bos, eos=cfg.eos, no_bos=bool(cfg.no_bos), engine=engine)
    if tok.eos_id is None:
        raise TokenizerError(
            f"{cfg.hf}: its files name no EOS token to end documents with: set tokenizer.eos"
        )
    return tok


def build_tokenizer_info(
    corpus: Corpus, path: Path, tok: Tokenizer | None = None
) -> dict[str, Any]:
    """The manifest's tokenizer entry (without the file) of the prepared tokenizer (`tok`,
    if open already) of a build of `corpus`.

    A tokenizer.json's entry also names its kind and the engine that encodes it (tiktoken
    or tokenizers, and why not tiktoken), which the build logs, and for a chat build the
    sha256 of the chat template its documents are rendered with.
    """
    recipe = corpus.recipe
    if not is_tokenizer_json(path):
        pieces = (*corpus.tokenizer_pieces(), *_fim_pieces(appends_fim_pieces(recipe)))
        return tokenizer_info(path, pieces)
    tok = tok if tok is not None else open_build_tokenizer(recipe, path)
    info = tok.info()
    if corpus.chat_format == "template":
        source = template_source(tok.files) or ""
        info["chat_template_sha256"] = hashlib.sha256(source.encode()).hexdigest()
    why = f" ({info['engine_reason']})" if info.get("engine_reason") else ""
    logger.info(f"tokenizer {path}: {info['vocab_size']} ids, encoded by {info['engine']}{why}")
    return info


def tokenizer_key(info: dict[str, Any]) -> str:
    """What a build's token runs depend on of its tokenizer: the file, and for a
    tokenizer.json the recipe's BOS/EOS and, in a chat build, the chat template."""
    if "kind" not in info:
        return str(info["sha256"])
    key = f"{info['sha256']}:{info['bos_id']}:{info['eos_id']}"
    return key + (f":{info['chat_template_sha256']}" if "chat_template_sha256" in info else "")


def copy_tokenizer_files(path: Path, out: Path) -> str:
    """Copy the prepared tokenizer into a build's directory; the name of its main file.

    A tokenizer.json travels with the config files beside it (BOS/EOS, chat template).
    """
    if path.name != "tokenizer.json":
        atomic_write_bytes(out / "tokenizer.model", path.read_bytes())
        return "tokenizer.model"
    for name in HF_FILES:
        if (path.parent / name).is_file():
            atomic_write_bytes(out / name, (path.parent / name).read_bytes())
    return "tokenizer.json"
