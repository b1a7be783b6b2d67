"""The recipe's `sources:` list: one input source each (files of one format and one domain),
the checks of the list, keyed by position (`sources[1].format ...`), and the files a
source's paths match (`expand_paths`: loading a recipe checks them, listing reads them)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lemur.data.recipe.errors import RecipeError

FORMATS = ("jsonl", "parquet", "files", "chat", "stack-v2")
# `format: chat` row layouts, each normalized to `messages` (lemur/data/read/chat.py).
CHAT_SCHEMAS = ("messages", "sharegpt", "oasst1", "openorca", "alpaca")
CHAT_DOMAIN = "chat"  # the domain of a chat source that names none
# Column layouts of well-known datasets; keys given in the recipe win over the preset's.
SOURCE_PRESETS: dict[str, dict[str, Any]] = {
    "the-stack": {
        "format": "parquet",
        "text_key": "content",
        "id_key": "hexsha",
        "path_key": "max_stars_repo_path",
        "language_key": "lang",
        "metadata_keys": ["max_stars_repo_name", "max_stars_count", "ext", "size"],
    },
    # The Stack v2: metadata rows; each file's content is a gzip blob fetched by its id
    # (lemur/data/read/stack_v2.py). Point `paths` at the metadata parquet files.
    "the-stack-v2": {"format": "stack-v2", "metadata_keys": ["star_events_count", "extension"]},
    "refinedweb": {
        "format": "parquet",
        "text_key": "content",
        "id_key": "url",
        "metadata_keys": ["url", "timestamp"],
    },
}
# Storage options shown as given (in the manifest, `--dry-run`, logs); any other key's value
# is shown as REDACTED: credentials (`key`, `secret`, `token`, ...) never leave the process.
PUBLIC_OPTIONS = frozenset(
    {
        "anon",
        "endpoint_url",
        "profile",
        "region_name",
        "requester_pays",
        "use_ssl",
        "verify",
        "default_block_size",
        "project",
        "revision",
        "client_kwargs",
        "config_kwargs",
        "connect_timeout",
        "read_timeout",
        "retries",
        "max_pool_connections",
        "version_aware",
    }
)
REDACTED = "<redacted>"
# Source, domain and benchmark names: they become file and directory names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_remote(path: str) -> bool:
    """Whether a source path is an fsspec URL (`s3://`, `gs://`, `hf://`, ...), not a local file."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() not in ("", "file", "local") and scheme.isascii()


def public_options(options: Any) -> Any:
    """Storage options with every value outside PUBLIC_OPTIONS replaced by REDACTED."""
    if not isinstance(options, Mapping):
        return options
    return {k: public_options(v) if k in PUBLIC_OPTIONS else REDACTED for k, v in options.items()}


def map_redacted(value: Any, public: Any, fn: Callable[[Any], Any]) -> Any:
    """`value` (storage options) with `fn` applied to every value `public` shows redacted."""
    if public == REDACTED:
        return fn(value)
    if isinstance(value, Mapping) and isinstance(public, Mapping):
        return {k: map_redacted(v, public[k], fn) for k, v in value.items()}
    return value


class StorageOptions(Mapping[str, Any]):
    """A source's fsspec storage options (endpoint, profile, credentials).

    Not a dict on purpose: `dataclasses.asdict` copies it whole instead of into a dict, so
    whatever serializes a recipe or a pipeline step (the manifest, datatrove's
    `executor.json`, logs) meets this object and gets `str()`, which hides the secrets.
    Pickled (a Slurm array's `executor.pik` on disk, a Ray task, a worker process), each
    secret value travels as the name of an environment variable that holds it
    (`LEMUR_SECRET_<hash>`, set in this process when the options are made, so that the
    processes it starts and the jobs it submits inherit it): no file ever holds it. A copy
    unpickled where that variable is missing lists the names in `missing`, and its first
    use fails saying so (give such nodes their credentials the standard way).
    """

    def __init__(self, options: Mapping[str, Any], *, export: bool = True) -> None:
        self._options = dict(options)
        self.missing: list[str] = []
        # A recipe's options go to the tasks and jobs; options made inside a task (a client's,
        # with our timeouts added) only need the redacted repr: nothing of them is exported.
        if export:
            map_redacted(self._options, self.public(), _export_secret)

    def __getitem__(self, key: str) -> Any:
        return self._options[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __getstate__(self) -> dict[str, Any]:
        return {"refs": map_redacted(self._options, self.public(), _export_secret)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.missing = []

        def restore(ref: Any) -> Any:
            name = ref.get(SECRET_REF) if isinstance(ref, Mapping) else None
            if name is None:
                return ref
            if name not in os.environ:
                self.missing.append(name)
                return None
            return json.loads(os.environ[name])

        refs = state["refs"]
        self._options = map_redacted(refs, public_options(refs), restore)

    def public(self) -> dict[str, Any]:
        """The options with their secrets redacted (what may be shown or written)."""
        return public_options(self._options)

    def secrets(self) -> list[str]:
        """Every redacted string value (scrubbed from error messages)."""
        found: list[str] = []

        def keep(value: Any) -> Any:
            if isinstance(value, str) and len(value) >= 4:
                found.append(value)
            return value

        map_redacted(self._options, self.public(), keep)
        return found

    def __repr__(self) -> str:
        return f"StorageOptions({self.public()!r})"

    __str__ = __repr__


SECRET_ENV_PREFIX = "LEMUR_SECRET_"  # environment variables carrying recipe credentials
SECRET_REF = "$lemur_secret_env"  # what a pickled secret becomes: {SECRET_REF: variable}


def _export_secret(value: Any) -> Any:
    """Put a secret value into this process's environment; the reference to it (a value
    that is no JSON, an object given in Python, stays as it is)."""
    try:
        data = json.dumps(value, sort_keys=True)
    except TypeError:
        return value
    name = SECRET_ENV_PREFIX + hashlib.sha256(data.encode()).hexdigest()[:16].upper()
    os.environ[name] = data  # inherited by the task processes and jobs this one starts
    return {SECRET_REF: name}


@dataclass(frozen=True)
class RemoteSettings:
    """How a source's remote inputs are read (defaults suit S3; see docs/scale.md).

    `concurrency`: requests in flight per task (read-ahead blocks, Stack v2 blobs);
    `block_bytes`: the size of one ranged read (a task buffers at most concurrency + 1);
    `retries`: tries after the first on throttling and transient errors, with jittered
    exponential backoff from `backoff_s` up to `max_backoff_s`; `timeout_s`: the longest
    one request may take (connect and every read, and the whole request).
    """

    concurrency: int = 8
    block_bytes: int = 8 << 20
    retries: int = 8
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for key in ("concurrency", "block_bytes"):
            if getattr(self, key) <= 0:
                raise RecipeError(f"recipe: remote.{key} must be > 0")
        for key in ("retries", "backoff_s", "max_backoff_s"):
            if getattr(self, key) < 0:
                raise RecipeError(f"recipe: remote.{key} must be >= 0")
        if self.timeout_s <= 0:
            raise RecipeError("recipe: remote.timeout_s must be > 0")


@dataclass(frozen=True)
class SourceConfig:
    """One input source: files of one format and one domain (checked by the recipe holding
    it, whose messages name its position)."""

    name: str
    domain: str
    paths: list[str]
    format: str
    text_key: str = "text"
    id_key: str = "id"
    include: list[str] | None = None
    exclude: list[str] | None = None
    languages: list[str] | None = None
    language: str | None = None
    language_key: str | None = None
    path_key: str | None = None
    metadata_keys: list[str] | None = None
    preset: str | None = None
    max_file_bytes: int = 10_000_000
    gitignore: bool = True
    skip_vendored: bool = True
    schema: str | None = None
    # Remote paths (`is_remote`): fsspec options of the filesystem, how it is read.
    storage_options: dict[str, Any] | None = None
    remote: RemoteSettings | None = None
    # format stack-v2: where a blob's content is (`{blob_id}` filled in) and its options,
    # the `license_type` values kept, whether generated files are skipped (vendored ones
    # are, by `skip_vendored`).
    content_url: str | None = None
    content_storage_options: dict[str, Any] | None = None
    licenses: list[str] | None = None
    skip_generated: bool | None = None

    def __post_init__(self) -> None:
        # Wrapped so that no serialization of the recipe writes a credential (StorageOptions).
        for key in ("storage_options", "content_storage_options"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, StorageOptions):
                object.__setattr__(self, key, StorageOptions(value))

    def remote_settings(self) -> RemoteSettings:
        """The `remote:` settings, defaults filled in."""
        return self.remote or RemoteSettings()


def expand_paths(source: SourceConfig, index: int | None = None) -> list[str]:
    """Expand `~` and globs of a source's paths; each entry must match something (the error
    says which key to set when the source's `index` in `sources` is given)."""
    out: list[str] = []
    for p in source.paths:
        if is_remote(p):  # listed once per build (read/remote_listing.py), not when loading
            out.append(p)
            continue
        pattern = os.path.expanduser(p)
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            hint = (
                ""
                if index is None
                else f"; point it at your files: --set 'sources.{index}.paths=[DIR_OR_GLOB]'"
            )
            raise RecipeError(f"recipe: source '{source.name}': path '{p}' matches nothing{hint}")
        out.extend(matches)
    return out


def check_sources(sources: Sequence[SourceConfig]) -> None:
    """RecipeError naming `sources[i]...` for an empty list, a bad or repeated name, domain,
    format or schema, no paths, or a non-positive max_file_bytes."""
    if not sources:
        raise RecipeError("recipe: 'sources' is empty")
    names = set()
    for i, s in enumerate(sources):
        key = f"sources[{i}]"
        if not NAME_RE.match(s.name):
            raise RecipeError(f"recipe: {key}.name {s.name!r} must be letters, digits, _ . -")
        if s.name in names:
            raise RecipeError(f"recipe: {key}.name {s.name!r} is used twice")
        names.add(s.name)
        if not NAME_RE.match(s.domain):
            raise RecipeError(f"recipe: {key}.domain {s.domain!r} must be letters, digits, _ . -")
        if s.format not in FORMATS:
            raise RecipeError(
                f"recipe: {key}.format {s.format!r} is not one of {', '.join(FORMATS)}"
            )
        _check_schema(s, key)
        _check_stack_v2(s, key)
        if not s.paths:
            raise RecipeError(f"recipe: {key}.paths is empty")
        if s.max_file_bytes <= 0:
            raise RecipeError(f"recipe: {key}.max_file_bytes must be > 0")


def _check_schema(s: SourceConfig, key: str) -> None:
    """`format: chat` names one of the chat schemas; no other format takes a schema."""
    if s.format != "chat":
        if s.schema is not None:
            raise RecipeError(f"recipe: {key}.schema is only for format chat, not {s.format!r}")
        return
    if s.schema is None:
        raise RecipeError(
            f"recipe: {key}.schema is required for format chat: one of {', '.join(CHAT_SCHEMAS)}"
        )
    if s.schema not in CHAT_SCHEMAS:
        raise RecipeError(
            f"recipe: {key}.schema {s.schema!r} is not one of {', '.join(CHAT_SCHEMAS)}"
        )


STACK_V2_KEYS = ("content_url", "content_storage_options", "licenses", "skip_generated")


def _check_stack_v2(s: SourceConfig, key: str) -> None:
    """The content keys belong to `format: stack-v2`; its `content_url` names `{blob_id}`."""
    if s.format != "stack-v2":
        for name in STACK_V2_KEYS:
            if getattr(s, name) is not None:
                raise RecipeError(f"recipe: {key}.{name} is only for format stack-v2")
        return
    if s.content_url is not None:
        _check_content_url(s.content_url, f"{key}.content_url")


# Where a Stack v2 blob's content is by default, and the one field a `content_url` fills in.
DEFAULT_CONTENT_URL = "s3://softwareheritage/content/{blob_id}"
CONTENT_FIELD = "blob_id"


def content_url(template: str | None, blob_id: str) -> str:
    """The URL of a Stack v2 blob: `template` (the source's `content_url`, Software
    Heritage's bucket when None) with `{blob_id}` filled in."""
    return (template or DEFAULT_CONTENT_URL).format(**{CONTENT_FIELD: blob_id})


def _check_content_url(url: str, key: str) -> None:
    """A `content_url` is a str.format template whose only field is `{blob_id}`: checked
    when the recipe loads, so that no task meets a KeyError per row."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(url) if field is not None]
    except ValueError as e:
        raise RecipeError(f"recipe: {key} {url!r} is not a template ({e})") from None
    for field in fields:
        if field != CONTENT_FIELD:
            raise RecipeError(
                f"recipe: {key} {url!r} names '{{{field}}}': the only field is {{{CONTENT_FIELD}}}"
            )
    if not fields:
        raise RecipeError(f"recipe: {key} must contain '{{{CONTENT_FIELD}}}'")
    try:  # a conversion or format spec that cannot apply to a blob id (`{blob_id:d}`)
        content_url(url, "0" * 40)
    except (ValueError, KeyError, IndexError) as e:
        raise RecipeError(f"recipe: {key} {url!r} is not a template ({e!r})") from None


@dataclass(frozen=True)
class ExcludeConfig:
    """The recipe's `exclude:` lists (lemur/data/read/exclude.py): files of one entry per
    line naming the repositories, paths (globs allowed) and document ids a build drops as
    it reads them (reason `excluded`): how a build honours opt-out requests."""

    repositories: str | None = None
    paths: str | None = None
    ids: str | None = None

    def __post_init__(self) -> None:
        for kind, path in self.files().items():
            if path is not None and not path.strip():
                raise RecipeError(f"recipe: exclude.{kind} is empty")

    def files(self) -> dict[str, str | None]:
        """{kind: file or None} of every kind of list."""
        return {"repositories": self.repositories, "paths": self.paths, "ids": self.ids}
