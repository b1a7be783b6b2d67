"""Hugging Face tokenizer files for a lemur SentencePiece model, ChatML pieces included.

`write_hf_tokenizer(model, folder)` writes what `transformers.AutoTokenizer` loads:
`tokenizer.model` (a copy), `tokenizer.json` (the `tokenizers` serialization),
`tokenizer_config.json`, `special_tokens_map.json`, and the model's
`generation_config.json` (generation stops at `</s>`, and at `<|im_end|>`, the end of a
chat answer, when the model has it). With the two ChatML pieces in the model, the config
carries a chat template that renders a conversation exactly as a lemur chat build frames
it: `<s>` + `<|im_start|>{role}\n{content}<|im_end|>\n` per message + `</s>`; with
`add_generation_prompt` it ends on `<|im_start|>assistant\n` instead (no `</s>`), the
prompt a chat model answers. transformers encodes what it renders (`legacy: false`: no `▁`
before the first marker, none after any) to the ids of the build and of `lemur-eval
generate --chat` (lemur/chatml.py), for a model with a dummy prefix too.

Why a hand-written tokenizer.json: transformers is a dev-only dependency, and without
the file, transformers 4.x converts `tokenizer.model` itself with Llama-2 assumptions
(a dummy-prefix "▁" before the text) that our models do not share. The file is plain
JSON; its BPE merges are derived here from the SentencePiece vocabulary as transformers'
own converter does, ranked by the merged piece's score, so the `tokenizers` library
encodes as SentencePiece does. Two known differences: where two different merges into
the same piece overlap (x+y and y+z both that piece), SentencePiece takes the leftmost
and `tokenizers` the lower rank; and for a model with a dummy prefix (Llama-2's),
transformers adds no "▁" before text that already starts with a space.

Plain `tokenizer(text)` adds `<s>` only: a prompt must not end in `</s>`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sentencepiece import sentencepiece_model_pb2 as model_pb2

from lemur.chatml import IM_END, IM_START
from lemur.tokenizer.base import TokenizerError
from lemur.tokenizer.sentencepiece import read_model

CHATML_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% else %}{{ eos_token }}{% endif %}"
)
FILES = (
    "tokenizer.model",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)

Piece = model_pb2.ModelProto.SentencePiece
# Pieces that never come out of a BPE merge: SentencePiece matches user-defined ones
# whole before merging, and controls and <unk> never occur in text.
ADDED_TYPES = (Piece.UNKNOWN, Piece.CONTROL, Piece.USER_DEFINED)


def read_model_proto(path: str | os.PathLike[str]) -> model_pb2.ModelProto:
    """The parsed SentencePiece model, checked to be one `tokenizers` can mirror exactly
    (TokenizerError naming it if not, or if it cannot be read)."""
    proto = read_model(path)
    normalizer = proto.normalizer_spec
    problems = [
        (proto.trainer_spec.model_type != model_pb2.TrainerSpec.BPE, "not a BPE model"),
        (normalizer.name not in ("identity", ""), f"normalization {normalizer.name!r}"),
        (bool(normalizer.precompiled_charsmap), "a precompiled normalization map"),
        (normalizer.remove_extra_whitespaces, "remove_extra_whitespaces"),
        (not normalizer.escape_whitespaces, "spaces not escaped as U+2581"),
        (proto.trainer_spec.treat_whitespace_as_suffix, "treat_whitespace_as_suffix"),
        (not proto.pieces, "no pieces"),
    ]
    for bad, what in problems:
        if bad:
            raise TokenizerError(f"{path}: cannot export to Hugging Face: {what}")
    return proto


def _special(proto: model_pb2.ModelProto, piece_id: int) -> str:
    """The piece string of a special id from the trainer spec (e.g. bos_id -> '<s>')."""
    if not 0 <= piece_id < len(proto.pieces):
        raise TokenizerError(f"special id {piece_id} is not in the vocabulary")
    return proto.pieces[piece_id].piece


def chatml_ids(proto: model_pb2.ModelProto) -> dict[str, int]:
    """Ids of the ChatML markers that are user-defined pieces of the model ({} if none)."""
    return {
        p.piece: i
        for i, p in enumerate(proto.pieces)
        if p.type == Piece.USER_DEFINED and p.piece in (IM_START, IM_END)
    }


def bpe_merges(proto: model_pb2.ModelProto) -> list[list[str]]:
    """Every merge (left, right) of two normal pieces into a normal piece, best score first.

    SentencePiece merges the pair whose result scores highest; trained models score
    pieces by minus their id, but hand-added ones need not (Llama-2's whitespace runs
    score -1e9), so the rank follows the score, then the id.
    """
    normal = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == Piece.NORMAL}
    merges: list[tuple[float, int, int, int, str, str]] = []
    for piece, piece_id in normal.items():
        score = -proto.pieces[piece_id].score
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((score, piece_id, normal[left], normal[right], left, right))
    merges.sort()
    return [[left, right] for *_, left, right in merges]


def _added_token(proto: model_pb2.ModelProto, piece_id: int) -> dict[str, Any]:
    """One `added_tokens` entry: split out before BPE; special unless an ordinary symbol."""
    piece = proto.pieces[piece_id]
    special = piece.type != Piece.USER_DEFINED or piece.piece in (IM_START, IM_END)
    return {
        "id": piece_id,
        "content": piece.piece,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _metaspace(proto: model_pb2.ModelProto) -> dict[str, Any]:
    """Spaces to U+2581, with SentencePiece's dummy prefix only where the model has one."""
    dummy_prefix = proto.normalizer_spec.add_dummy_prefix
    # "first": only at the start of the text, as SentencePiece adds it once per input.
    scheme = "first" if dummy_prefix else "never"
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False}


def _bos_template(bos: str, bos_id: int) -> dict[str, Any]:
    """The post-processor: `<s>` before each sequence (and before the second of a pair)."""

    def part(sequence: str, type_id: int) -> list[dict[str, Any]]:
        return [
            {"SpecialToken": {"id": bos, "type_id": type_id}},
            {"Sequence": {"id": sequence, "type_id": type_id}},
        ]

    return {
        "type": "TemplateProcessing",
        "single": part("A", 0),
        "pair": part("A", 0) + part("B", 1),
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def tokenizer_json(proto: model_pb2.ModelProto) -> dict[str, Any]:
    """The `tokenizers` serialization (tokenizer.json) that encodes as the model does."""
    bos = _special(proto, proto.trainer_spec.bos_id)
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if proto.normalizer_spec.add_dummy_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            _added_token(proto, i) for i, p in enumerate(proto.pieces) if p.type in ADDED_TYPES
        ],
        "normalizer": None,
        "pre_tokenizer": _metaspace(proto),
        "post_processor": _bos_template(bos, proto.trainer_spec.bos_id),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": _special(proto, proto.trainer_spec.unk_id),
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": proto.trainer_spec.byte_fallback,
            "ignore_merges": False,
            "vocab": {p.piece: i for i, p in enumerate(proto.pieces)},
            "merges": bpe_merges(proto),
        },
    }


def special_tokens_map(proto: model_pb2.ModelProto) -> dict[str, Any]:
    """special_tokens_map.json: <s>, </s>, <unk>, and the ChatML markers when present."""
    spec = proto.trainer_spec
    out: dict[str, Any] = {
        "bos_token": _special(proto, spec.bos_id),
        "eos_token": _special(proto, spec.eos_id),
        "unk_token": _special(proto, spec.unk_id),
    }
    chat = chatml_ids(proto)
    if chat:
        out["additional_special_tokens"] = sorted(chat, key=chat.__getitem__)
    return out


def tokenizer_config(
    proto: model_pb2.ModelProto, model_max_length: int | None = None
) -> dict[str, Any]:
    """tokenizer_config.json: LlamaTokenizer, <s> added, no dummy prefix unless the model's."""
    entries = {
        str(i): {k: v for k, v in _added_token(proto, i).items() if k != "id"}
        for i, p in enumerate(proto.pieces)
        if p.type in ADDED_TYPES
    }
    config: dict[str, Any] = {
        "tokenizer_class": "LlamaTokenizer",
        **special_tokens_map(proto),
        "add_bos_token": True,
        # Documents are `<s> text </s>` in the shards, but `tokenizer(prompt)` must leave
        # the document open for generation; the chat template closes full conversations.
        "add_eos_token": False,
        # transformers' Llama classes prepend "▁" unless told otherwise (legacy=False keeps
        # text after special tokens unprefixed).
        "add_prefix_space": proto.normalizer_spec.add_dummy_prefix,
        "legacy": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": entries,
    }
    config.pop("additional_special_tokens", None)  # v5 reads them from added_tokens_decoder
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    if len(chatml_ids(proto)) == 2:
        config["chat_template"] = CHATML_TEMPLATE
    return config


def generation_config(proto: model_pb2.ModelProto) -> dict[str, Any]:
    """generation_config.json: stop at `</s>`, and at `<|im_end|>` when the model has it."""
    spec = proto.trainer_spec
    chat = chatml_ids(proto)
    stops = [spec.eos_id] + ([chat[IM_END]] if IM_END in chat else [])
    return {
        "bos_token_id": spec.bos_id,
        "eos_token_id": stops if len(stops) > 1 else spec.eos_id,
        "_from_model_config": False,
    }


def write_hf_tokenizer(
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    model_max_length: int | None = None,
) -> list[Path]:
    """Write the tokenizer files (`FILES`) into `out_dir` (created); returns their paths."""
    proto = read_model_proto(model_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / FILES[0]).exists() or not (out / FILES[0]).samefile(model_path):
        shutil.copyfile(model_path, out / FILES[0])
    contents = (
        tokenizer_json(proto),
        tokenizer_config(proto, model_max_length),
        special_tokens_map(proto),
        generation_config(proto),
    )
    for name, content in zip(FILES[1:], contents, strict=True):
        (out / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    return [out / name for name in FILES]
