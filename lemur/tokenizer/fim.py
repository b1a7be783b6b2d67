"""Fill-in-the-middle (FIM) and repository markers of code models, and FIM ids as they train.

One API for the build (FIM documents), repository documents and `lemur-eval infill`:

- `CodeMarkers`: the marker ids of one model (prefix, middle, suffix; optional pad, eot,
  repo_name, file_sep) and the style they follow.
- `find_code_markers(tokenizer, names=None)`: the markers a tokenizer has, by the names of
  a known family (`MARKER_STYLES`: Qwen2.5-Coder, StarCoder(2), DeepSeek-Coder, CodeLlama) or
  by names a recipe gives; None when it has none.
- `FIM_PIECES`: the four CodeLlama pieces (`▁<PRE>`, `▁<SUF>`, `▁<MID>`, `▁<EOT>`) that the
  build appends to a SentencePiece model without markers (ids `vocab_size`...+3, every
  other id the same), as CONTROL pieces: SentencePiece never produces a control id from text,
  so a document that spells `<PRE>` keeps the ids of its characters.
- A part is a marker id (`int`), continuing text (`str`) or text at the start of a text
  (`Leading`); `encode_parts(tokenizer, parts)` encodes each text part alone.
- `fim_parts(prefix, middle, suffix, markers, spm=...)`: a FIM document's parts, PSM
  `<PRE> prefix <SUF> suffix <MID> middle` or SPM `<PRE> <SUF> suffix <MID> prefix middle`
  (Bavarian et al. 2022, Megatron's `fim_dataset.py`), then `<EOT>` where the model has one
  (CodeLlama); `fim_prompt_ids(...)`: the infilling prompt, the same tokens up to the middle;
  `decode_continuing(tokenizer, ids)`: the text of a generated middle (no dummy-prefix
  space dropped).

How text parts are encoded, as each model's FIM prompt does it:
- tokenizer.json models (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder): the prompt is a string
  whose markers the HF tokenizer splits out, each run between them encoded alone, so each
  text part is `tokenizer.encode(part)`.
- SentencePiece (CodeLlama's convention, Llama-2's dummy prefix): the prefix is encoded as a
  text of its own (with the dummy-prefix `▁`), the suffix and the middle without it
  (CodeLlama's `encode_infilling`); in SPM the prefix and middle are one text
  (Roziere et al. 2023, section 2.3: "we concatenate the prefix and the middle part before
  encoding"). Other styles' SPM encodes prefix and middle apart, as Megatron does.

Text never becomes a marker id: `Tokenizer.encode` encodes added and special tokens'
spellings as text (a code file that spells `<|fim_prefix|>` gets the ids of its
characters, as for `<|endoftext|>`); marker ids come only from `int` parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lemur.tokenizer.base import Tokenizer, TokenizerError

# The roles a recipe may name, in CodeMarkers' field order; the first three are required.
MARKER_ROLES = ("prefix", "middle", "suffix", "pad", "eot", "repo_name", "file_sep")
REQUIRED_ROLES = MARKER_ROLES[:3]

# Known families: role -> token text. Tried in this order; the first whose prefix, middle
# and suffix are all single tokens of the vocabulary wins.
MARKER_STYLES: dict[str, dict[str, str]] = {
    "qwen2.5-coder": {
        "prefix": "<|fim_prefix|>",
        "middle": "<|fim_middle|>",
        "suffix": "<|fim_suffix|>",
        "pad": "<|fim_pad|>",
        "repo_name": "<|repo_name|>",
        "file_sep": "<|file_sep|>",
    },
    "starcoder": {
        "prefix": "<fim_prefix>",
        "middle": "<fim_middle>",
        "suffix": "<fim_suffix>",
        "pad": "<fim_pad>",
        "repo_name": "<repo_name>",
        "file_sep": "<file_sep>",
    },
    "deepseek-coder": {
        "prefix": "<\uff5cfim\u2581begin\uff5c>",  # <｜fim▁begin｜>: before the prefix
        "middle": "<\uff5cfim\u2581end\uff5c>",  # <｜fim▁end｜>: before the middle
        "suffix": "<\uff5cfim\u2581hole\uff5c>",  # <｜fim▁hole｜>: before the suffix
    },
    "codellama": {
        "prefix": "\u2581<PRE>",
        "middle": "\u2581<MID>",
        "suffix": "\u2581<SUF>",
        "eot": "\u2581<EOT>",
    },
}
# StarCoder2 spells its repository marker `<repo_name>`, StarCoder (1) `<reponame>`.
_ALTERNATIVES = {("starcoder", "repo_name"): ("<reponame>",)}
# Appended to a SentencePiece model that has no markers, in CodeLlama's id order.
FIM_PIECES = tuple(MARKER_STYLES["codellama"][r] for r in ("prefix", "suffix", "middle", "eot"))


@dataclass(frozen=True)
class CodeMarkers:
    """The FIM and repository marker ids of one model, and the style (family) they follow."""

    style: str  # a MARKER_STYLES name, or "recipe" for names a recipe gave
    prefix: int
    middle: int
    suffix: int
    pad: int | None = None
    eot: int | None = None  # ends the middle (CodeLlama's `<EOT>`); others end with EOS
    repo_name: int | None = None
    file_sep: int | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        """Every marker id this model has."""
        return tuple(
            i for i in (getattr(self, r) for r in MARKER_ROLES) if isinstance(i, int) and i >= 0
        )

    @property
    def joins_spm(self) -> bool:
        """Whether SPM encodes prefix and middle as one text (CodeLlama's convention)."""
        return self.style == "codellama"


class Leading(str):
    """A text part encoded as a text of its own: with the dummy-prefix `▁` of a SentencePiece
    model that adds one (a plain `str` part continues a text: no `▁` added)."""

    __slots__ = ()


Part = int | str  # a marker id, or text (`str`, or `Leading`)


def _lookup(tokenizer: Tokenizer, style: str, names: Mapping[str, str]) -> dict[str, int | None]:
    """role -> id of each named token the vocabulary holds as one token (None if absent)."""
    out: dict[str, int | None] = {}
    for role, name in names.items():
        i = tokenizer.piece_id(name)
        for other in _ALTERNATIVES.get((style, role), ()):
            i = i if i is not None else tokenizer.piece_id(other)
        out[role] = i
    return out


def find_code_markers(
    tokenizer: Tokenizer, names: Mapping[str, str] | None = None
) -> CodeMarkers | None:
    """The code markers of `tokenizer`: those `names` gives (role -> token text, roles as in
    MARKER_ROLES; TokenizerError naming a token the vocabulary lacks or one that text
    encodes to: `Tokenizer.is_control`), else the first known family's (MARKER_STYLES) whose
    prefix, middle and suffix it has; None when none."""
    if names:
        unknown = sorted(set(names) - set(MARKER_ROLES))
        missing = [r for r in REQUIRED_ROLES if r not in names]
        if unknown or missing:
            what = f"unknown role {unknown[0]!r}" if unknown else f"no {missing[0]!r} token"
            raise TokenizerError(f"FIM markers: {what} (roles: {', '.join(MARKER_ROLES)})")
        found = _lookup(tokenizer, "recipe", names)
        for role, i in sorted(found.items(), key=lambda item: MARKER_ROLES.index(item[0])):
            where = f"{names[role]!r} (fim.markers.{role})"
            if i is None:
                raise TokenizerError(f"FIM markers: the tokenizer has no token {where}")
            # A marker text can encode to would make ordinary code (`def`) a FIM boundary.
            if not tokenizer.is_control(i):
                raise TokenizerError(
                    f"FIM markers: {where} is an ordinary token of the vocabulary (id {i}): "
                    "text encodes to it; name added, special or control tokens, or leave "
                    "fim.markers out to use the model's own"
                )
        return CodeMarkers(style="recipe", **found)  # type: ignore[arg-type]
    for style, spelled in MARKER_STYLES.items():
        found = _lookup(tokenizer, style, spelled)
        if all(found[r] is not None for r in REQUIRED_ROLES):
            return CodeMarkers(style=style, **found)  # type: ignore[arg-type]
    return None


def _continuing(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of `text` continuing a text: a SentencePiece model's without its dummy prefix."""
    encode_chat = getattr(tokenizer, "encode_chat", None)  # SentencePiece: no dummy prefix
    if tokenizer.kind == "sentencepiece" and encode_chat is not None:
        return list(encode_chat(text))
    return list(tokenizer.encode(text))


def decode_continuing(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """The text of ids that continue a text (a generated middle, a suffix): a SentencePiece
    model's without dropping a leading space as its dummy prefix's (CodeLlama's
    `decode_infilling`); any other tokenizer's plain `decode`."""
    decode = getattr(tokenizer, "decode_continuing", None)
    if tokenizer.kind == "sentencepiece" and decode is not None:
        return str(decode(ids))
    return tokenizer.decode(ids)


def encode_parts(tokenizer: Tokenizer, parts: Sequence[Part]) -> list[int]:
    """The ids of `parts`: a marker id as itself, each text part encoded alone (`Leading`
    with a SentencePiece model's dummy prefix, `str` without); text never gives a marker."""
    ids: list[int] = []
    for part in parts:
        if isinstance(part, Leading):
            ids += tokenizer.encode(str(part))
        elif isinstance(part, str):
            ids += _continuing(tokenizer, part)
        else:
            ids.append(int(part))
    return ids


@dataclass(frozen=True)
class Span:
    """A text part given by where it lies in the document (characters `start:end`), encoded
    as a text of its own (`leading`, as `Leading`) or as continuing text (as `str`)."""

    start: int
    end: int
    leading: bool


def fim_layout(a: int, b: int, n: int, markers: CodeMarkers, *, spm: bool) -> list[int | Span]:
    """A FIM document's parts for a text of `n` characters cut at `a <= b`: PSM
    `<PRE> prefix <SUF> suffix <MID> middle`, or SPM `<PRE> <SUF> suffix <MID> prefix
    middle`; `<EOT>` after the middle where the model has one. The prefix is a leading
    text; CodeLlama's SPM joins prefix and middle. The one home of the FIM order: `fim_parts`
    fills it with text, the build's splicer (lemur/tokenizer/fim_splice.py) with ids."""
    end: list[int | Span] = [] if markers.eot is None else [markers.eot]
    if not spm:
        return [
            markers.prefix,
            Span(0, a, True),
            markers.suffix,
            Span(b, n, False),
            markers.middle,
            Span(a, b, False),
            *end,
        ]
    tail: list[int | Span] = (
        [Span(0, b, True)] if markers.joins_spm else [Span(0, a, True), Span(a, b, False)]
    )
    return [markers.prefix, markers.suffix, Span(b, n, False), markers.middle, *tail, *end]


def fim_parts(
    prefix: str, middle: str, suffix: str, markers: CodeMarkers, *, spm: bool
) -> list[Part]:
    """A FIM document's parts (`fim_layout`'s order) with their text: a leading part as
    `Leading`, a continuing one as `str`, markers as ids."""
    text = prefix + middle + suffix
    a = len(prefix)
    layout = fim_layout(a, a + len(middle), len(text), markers, spm=spm)
    return [
        p if isinstance(p, int) else (Leading if p.leading else str)(text[p.start : p.end])
        for p in layout
    ]


def fim_prompt_parts(prefix: str, suffix: str, markers: CodeMarkers, *, spm: bool) -> list[Part]:
    """The infilling prompt's parts: a FIM document's up to where its middle starts."""
    if not spm:
        return [markers.prefix, Leading(prefix), markers.suffix, suffix, markers.middle]
    return [markers.prefix, markers.suffix, suffix, markers.middle, Leading(prefix)]


def fim_prompt_ids(
    tokenizer: Tokenizer,
    markers: CodeMarkers,
    prefix: str,
    suffix: str,
    *,
    spm: bool,
    bos_id: int | None = -1,
) -> list[int]:
    """The ids a model is prompted with to fill in between `prefix` and `suffix`: the
    training document's tokens up to its middle, after the BOS that frames every document
    (`bos_id`: the tokenizer's by default; None for none). The model's answer is the middle,
    ended by `markers.eot` where the model has one, else by its EOS."""
    bos = tokenizer.bos_id if bos_id == -1 else bos_id
    head = [] if bos is None else [bos]
    return head + encode_parts(tokenizer, fim_prompt_parts(prefix, suffix, markers, spm=spm))
