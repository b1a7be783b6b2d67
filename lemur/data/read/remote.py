"""Remote inputs: fsspec filesystems opened in each task's process, read in ranged blocks
with bounded concurrency, retried politely, counted.

Every source path that is an fsspec URL (`s3://`, `gs://`, `hf://datasets/...`) is read
through `Remote`: one per source and process, holding the filesystem client (made lazily,
never pickled: a Ray or Slurm task opens its own), a thread pool of `concurrency` workers
and the retry policy. A request that fails with throttling or a transient error (HTTP 429,
500/502/503/504, S3 `SlowDown`, a connection reset, a read timeout) is tried again after
a jittered exponential backoff ("full jitter": a uniform wait up to `backoff_s * 2**try`,
capped); one that still fails after `retries` tries raises `RemoteError`, one line naming
the URL. Each request is bounded in time (`timeout_s`: the client's connect and read
timeouts, and the whole request on async filesystems).

fsspec's own `open()` is not used to stream: its read-ahead is not bounded by our settings
and its retries would be neither counted nor bounded by them; `RemoteFile` reads blocks of
`block_bytes` by range, keeping at most `concurrency` of them in flight ahead of the reader.
The filesystem clients' own retries are turned off where the client allows it (s3fs and
botocore), so that every retry is ours and counted (`remote_retries:<source>`).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

from loguru import logger  # datatrove's logger: a task's lines land in its log file

from lemur.data.recipe.sources import REDACTED, RemoteSettings, StorageOptions, is_remote

# HTTP statuses and S3 error codes that mean "try again later", not "this will never work".
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "503",
        "429",
        "500",
        "502",
        "504",
    }
)
# Exception classes (by name, so that no client library must be imported) of broken
# connections and timeouts in botocore, aiohttp, urllib3, requests and fsspec.
TRANSIENT_TYPES = frozenset(
    {
        "HTTPClientError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "EndpointConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientOSError",
        "IncompleteRead",
        "FSTimeoutError",
        "ResponseParserError",
        "ProtocolError",
        "ChunkedEncodingError",
        "ReadTimeout",
        "ConnectTimeout",
    }
)
# Environment variables whose values are credentials: scrubbed from messages too.
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "GOOGLE_API_KEY")
Count = Callable[[str, int], None]


class RemoteError(OSError):
    """A remote read that failed for good (retries exhausted, or an error not worth retrying)."""


class RemoteChanged(RemoteError):
    """An object that is no longer the version listed (its ETag or size moved): nothing of
    the new version is read as the old one's."""


# HTTP 412: a conditional request (If-Match: the listed ETag) whose object has changed.
PRECONDITION_FAILED = 412
# Info keys that change when an object is rewritten, in order of preference.
VERSION_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "blob_id", "oid", "LastModified", "mtime")


def object_version(info: Mapping[str, Any]) -> str:
    """What changes when an object is rewritten: its ETag, else its hash or mtime ("" if
    the filesystem tells none)."""
    for key in VERSION_KEYS:
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""


def display_url(url: str) -> str:
    """A URL as it may be shown: without a user, password or query (presigned signatures)."""
    if not is_remote(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _status(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status, error code) an exception carries, from botocore, aiohttp or requests."""
    response = getattr(e, "response", None)
    if isinstance(response, Mapping):  # botocore ClientError
        meta = response.get("ResponseMetadata", {})
        return meta.get("HTTPStatusCode"), str(response.get("Error", {}).get("Code", ""))
    status = getattr(e, "status", None) or getattr(response, "status_code", None)
    return (status if isinstance(status, int) else None), ""


def is_transient(error: BaseException) -> bool:
    """Whether an error (or one it was raised from) is throttling or a transient failure."""
    for e in _chain(error):
        status, code = _status(e)
        if status in TRANSIENT_STATUS or code in TRANSIENT_CODES:
            return True
        if isinstance(e, ConnectionError | TimeoutError):
            return True
        if any(t.__name__ in TRANSIENT_TYPES for t in type(e).__mro__):
            return True
        text = str(e)
        if "SlowDown" in text or "reduce your request rate" in text:
            return True
    return False


def _client_options(protocol: str, options: Mapping[str, Any], timeout: float) -> StorageOptions:
    """The storage options a client is made with: the user's, plus our timeouts and, where
    the client allows it, its own retries off (ours are counted and bounded). A
    StorageOptions, never a plain dict: a traceback that prints this frame's variables (as
    datatrove's task logs do) shows its secrets as <redacted>."""
    opts = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        opts["config_kwargs"] = config
    # Not exported: our settings (a retry count of 1) are no secrets to put in the
    # environment of every job this process submits.
    return StorageOptions(opts, export=False)


class ClientError(RemoteError):
    """A filesystem client that cannot be made (its library missing, a protocol fsspec does
    not know, options its constructor refuses): the reason, without a URL or a secret."""


def client_class(protocol: str) -> type:
    """fsspec's filesystem class of `protocol`; ClientError saying what to install or that
    the protocol is unknown. Looked up before any option is in scope."""
    import fsspec

    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise ClientError(f"the {protocol}:// client is not installed ({e})") from None
    except ValueError as e:
        raise ClientError(f"{e} (no filesystem for protocol '{protocol}'; misspelt?)") from None
    except Exception as e:  # noqa: BLE001 - a broken install raises anything on import
        raise ClientError(f"the {protocol}:// client cannot be loaded: {_brief(e)}") from None


def _options_key(opts: StorageOptions) -> str:
    """What tells two clients' options apart, hashed: no secret sits in the clients' table."""
    return hashlib.sha256(repr(sorted(opts.items(), key=lambda kv: kv[0])).encode()).hexdigest()


# Filesystem clients of this process by (pid, protocol, options): a forked task makes its own.
_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def filesystem(url: str, options: Mapping[str, Any] | None, timeout: float) -> Any:
    """The fsspec filesystem of a URL's protocol with these options, one per process;
    ClientError (scrubbed of the options' secrets, its cause dropped: the constructor's
    frames hold the secrets as plain values) when it cannot be made."""
    protocol = url.split("://", 1)[0].lower()
    cls = client_class(protocol)
    opts = _client_options(protocol, options or {}, timeout)
    key = (os.getpid(), protocol, _options_key(opts))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            try:
                fs = cls(skip_instance_cache=True, **opts)
            except Exception as e:  # noqa: BLE001 - every client raises its own types
                reason = f"cannot make the {protocol}:// client: {_brief(e)}"
                for secret in opts.secrets():
                    reason = reason.replace(secret, REDACTED)
                raise ClientError(reason) from None
            if protocol in ("s3", "s3a"):
                fs.retries = 1  # s3fs's own retry loop (a class attribute): one try, ours count
            _CLIENTS[key] = fs
        return _CLIENTS[key]


class Remote:
    """One source's remote reading in this process: client, thread pool, retries, counters.

    Picklable: the client and the pool are made on first use in the process that reads.
    """

    def __init__(
        self,
        options: StorageOptions | Mapping[str, Any] | None,
        settings: RemoteSettings,
        count: Count | None = None,
    ) -> None:
        if options is not None and not isinstance(options, StorageOptions):
            options = StorageOptions(options, export=False)  # printed redacted, never exported
        self.options = options
        self.settings = settings
        self.count = count or (lambda kind, n: None)
        secrets = options.secrets() if options is not None else []
        self.secrets = secrets + [os.environ[k] for k in SECRET_ENV if os.environ.get(k)]
        self._pool: ThreadPoolExecutor | None = None
        self._random = random.Random()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}

    def scrub(self, text: str) -> str:
        """`text` with every credential we know of replaced (error messages quote servers)."""
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def client(self, url: str) -> Any:
        """The filesystem client for `url` in this process; ClientError (the reason alone)
        when it cannot be made."""
        missing = getattr(self.options, "missing", None)
        if missing:  # a pickled copy on a node that did not inherit the recipe's credentials
            raise ClientError(
                f"the recipe's credentials are not in this process's "
                f"environment ({', '.join(missing)}); give every node its credentials the "
                "standard way (AWS_* variables, a profile, HF_TOKEN) instead"
            )
        return filesystem(url, self.options, self.settings.timeout_s)

    def fs(self, url: str) -> Any:
        """The filesystem client for `url` in this process; RemoteError naming the URL and
        why when it cannot be made (every read of it fails so, as one bad input each)."""
        try:
            return self.client(url)
        except ClientError as e:
            raise RemoteError(self.scrub(f"{display_url(url)}: {e}")) from None

    @property
    def pool(self) -> ThreadPoolExecutor:
        """This process's pool of `concurrency` request threads."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency, "lemur-remote")
        return self._pool

    def _once(self, fs: Any, method: str | Callable, *args: Any, **kwargs: Any) -> Any:
        """One request, bounded in time on async filesystems (fsspec cancels it). `method`
        names the filesystem's method, or is a coroutine function of (fs, *args)."""
        if callable(method):
            from fsspec.asyn import sync

            return sync(fs.loop, method, fs, *args, timeout=self.settings.timeout_s, **kwargs)
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync

            coroutine = getattr(fs, "_" + method)
            return sync(fs.loop, coroutine, *args, timeout=self.settings.timeout_s, **kwargs)
        return getattr(fs, method)(*args, **kwargs)

    def changed(self, url: str, how: str) -> RemoteChanged:
        """The error of an object that is no longer the version listed, counted `changed`."""
        self.count("changed", 1)
        return RemoteChanged(
            f"{display_url(url)} changed since it was listed ({how}): its listing is dropped "
            "and it is listed again on the next run"
        )

    def call(self, what: str, url: str, method: str | Callable, *args: Any, **kwargs: Any) -> Any:
        """`fs.<method>(*args)` with retries; RemoteError naming `what` and the URL at the end
        (RemoteChanged when a conditional request finds the object changed)."""
        fs = self.fs(url)
        s = self.settings
        for attempt in range(s.retries + 1):
            self.count("requests", 1)
            try:
                return self._once(fs, method, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - every client raises its own types
                if any(_status(c)[0] == PRECONDITION_FAILED for c in _chain(e)):
                    self.count("failures", 1)
                    raise self.changed(url, f"{what}: HTTP 412, not the listed ETag") from None
                transient = is_transient(e)
                if not transient or attempt == s.retries:
                    self.count("failures", 1)
                    tries = f" after {attempt + 1} tries" if transient else ""
                    message = self.scrub(f"{display_url(url)}: {what} failed{tries}: {_brief(e)}")
                    if isinstance(e, FileNotFoundError):
                        raise FileNotFoundError(2, message) from None
                    raise RemoteError(message) from None
                self.count("retries", 1)
                cap = min(s.max_backoff_s, s.backoff_s * 2**attempt)
                wait = self._random.uniform(0, cap)
                # What a throttled build prints (the task's log and stderr), one line a retry.
                logger.warning(
                    self.scrub(
                        f"remote: {display_url(url)}: {what}: {_brief(e)}; "
                        f"retry {attempt + 1} of {s.retries} in {wait:.1f}s"
                    )
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    def cat(
        self, url: str, start: int | None = None, end: int | None = None, version: str = ""
    ) -> bytes:
        """Bytes [start, end) of an object (all of it without bounds), counted. With the
        listed `version` (ETag), an S3 object is read only while it is that version
        (`If-Match`: RemoteChanged otherwise, in the same request)."""
        what = "GET" if start is None else f"GET bytes {start}-{end}"
        if version and url.split("://", 1)[0].lower() in ("s3", "s3a"):
            data = self.call(what, url, _s3_get_if_match, url, start, end, version)
        else:
            data = self.call(what, url, "cat_file", url, start=start, end=end)
        self.count("bytes", len(data))
        return data

    def info(self, url: str) -> dict[str, Any]:
        """An object's size and version (ETag) by one HEAD request."""
        return self.call("HEAD", url, "info", url)

    def open(
        self,
        url: str,
        size: int | None = None,
        block_bytes: int = 0,
        ahead_until: int = -1,
        version: str = "",
    ) -> BinaryIO:
        """A buffered, seekable reader of an object (its size looked up when not given);
        `block_bytes` overrides the setting (small for a head or a footer); no block from
        `ahead_until` on is read ahead (the end of a byte-range part), only when asked.

        With the listed `version`, what is read is that version or nothing: on S3 every
        ranged GET carries `If-Match`; elsewhere (no conditional read in fsspec) one HEAD
        compares the version before the first byte is read. RemoteChanged otherwise.
        """
        if size is None or size < 0:
            size = int(self.info(url)["size"])
        if version and url.split("://", 1)[0].lower() not in ("s3", "s3a"):
            now = object_version(self.info(url))
            if now != version:
                raise self.changed(url, f"version {version}, now {now or 'unknown'}")
            version = ""  # checked: the ranged reads go unconditioned
        raw = RemoteFile(self, url, size, block_bytes or self.settings.block_bytes, version)
        if ahead_until >= 0:
            raw.ahead_until = ahead_until
        return io.BufferedReader(raw, buffer_size=min(1 << 20, raw.block))


async def _s3_get_if_match(
    fs: Any, url: str, start: int | None, end: int | None, etag: str
) -> bytes:
    """Bytes [start, end) of an S3 object (all without bounds) if its ETag is still `etag`:
    a GET with `If-Match`, answered 412 when the object was rewritten (s3fs's `cat_file`
    sends no conditions)."""
    bucket, key, version_id = fs.split_path(url)
    extra: dict[str, Any] = {"VersionId": version_id} if version_id else {}
    if start is not None:
        extra["Range"] = f"bytes={start}-{(end or 0) - 1}" if end is not None else f"bytes={start}-"
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=f'"{etag}"', **extra)
    try:
        return await response["Body"].read()
    finally:
        response["Body"].close()


def _chain(error: BaseException) -> list[BaseException]:
    """An error and those it was raised from, outermost first."""
    out: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and all(e is not o for o in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _brief(error: BaseException) -> str:
    """An error in one line: the HTTP status and code it carries, else its type; its text."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    for e in _chain(error):
        status, code = _status(e)
        if status or code:
            code = "" if code == str(status) else code  # botocore's code for a bare status
            head = " ".join(str(x) for x in (f"HTTP {status}" if status else "", code) if x)
            return f"{head}: {text}" if text else head
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class RemoteFile(io.RawIOBase):
    """A seekable reader of a remote object by ranged requests of `block_bytes`.

    Reading in order keeps the next `concurrency` blocks in flight (the bounded read-ahead
    buffer); a seek elsewhere (a parquet footer, a column chunk) fetches just that block.
    A block shorter than the listed size says the object changed since it was listed; with
    the listed version, every block is read under it (`If-Match`, S3), so that blocks of two
    versions are never joined.
    """

    def __init__(self, remote: Remote, url: str, size: int, block: int, version: str = "") -> None:
        super().__init__()
        self.remote = remote
        self.url = url
        self.version = version  # the listed ETag every block is read under (S3), or ""
        self.size = size
        self.block = block
        self.ahead = remote.settings.concurrency
        self.ahead_until = size  # no read-ahead of blocks starting at or after this byte
        self._pos = 0
        self._last = -1
        self._current: tuple[int, bytes] = (-1, b"")
        self._pending: dict[int, Future[bytes]] = {}

    def readable(self) -> bool:
        """Always readable."""
        return True

    def seekable(self) -> bool:
        """Always seekable."""
        return True

    def tell(self) -> int:
        """The position."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the position (no request until the next read)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _fetch(self, k: int) -> bytes:
        start = k * self.block
        end = min(self.size, start + self.block)
        data = self.remote.cat(self.url, start, end, self.version)
        if len(data) != end - start:
            raise self.remote.changed(
                self.url, f"bytes {start}-{end} came back {len(data)} bytes long of {self.size}"
            )
        return data

    def _block(self, k: int) -> bytes:
        """Block k, from the read-ahead when it is there; keeps the read-ahead going."""
        if self._current[0] == k:
            return self._current[1]
        blocks = -(-min(self.size, self.ahead_until) // self.block)
        if k in (0, self._last + 1):  # reading in order: keep `ahead` blocks in flight
            for j in range(k + 1, min(blocks, k + 1 + self.ahead)):
                if j not in self._pending:
                    self._pending[j] = self.remote.pool.submit(self._fetch, j)
        future = self._pending.pop(k, None)
        for j in [j for j in self._pending if j < k or j > k + self.ahead]:
            self._pending.pop(j).cancel()  # a seek elsewhere: those are not needed
        data = future.result() if future is not None else self._fetch(k)
        self._last = k
        self._current = (k, data)
        return data

    def readinto(self, b) -> int:  # type: ignore[override]
        """Fill `b` from the block at the position; 0 at the end."""
        if self._pos >= self.size:
            return 0
        k = self._pos // self.block
        data = self._block(k)
        offset = self._pos - k * self.block
        n = min(len(b), len(data) - offset)
        b[:n] = data[offset : offset + n]
        self._pos += n
        return n

    def close(self) -> None:
        """Cancel the read-ahead."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._current = (-1, b"")
        super().close()
