"""One task's remote reading: a `Remote` per source, made in the process that reads, with
its counts as the task's stat labels (`remote_<kind>:<source>`, labels.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO

from lemur.data.labels import remote_label
from lemur.data.read.remote import Remote
from lemur.data.recipe.sources import is_remote


class SourceCounter:
    """Counts one source's remote reading as stat labels `remote_<kind>:<source>` (picklable)."""

    def __init__(self, stat_update: Callable[..., None], source: str) -> None:
        self.stat_update = stat_update
        self.source = source

    def __call__(self, kind: str, n: int) -> None:
        self.stat_update(remote_label(kind, self.source), value=n)


class RemoteInputs:
    """One task's remote reading, a `Remote` per source, counted as `remote_<kind>:<source>`."""

    def __init__(self, sources: list, stat_update: Callable[..., None]) -> None:
        self.sources = sources
        self.stat_update = stat_update
        self._remotes: dict[tuple[int, str], Remote] = {}

    def remote(self, source: int, which: str = "storage_options") -> Remote:
        """The `Remote` of a source (`which`: its storage options or its content's)."""
        key = (source, which)
        if key not in self._remotes:
            config = self.sources[source]
            count = SourceCounter(self.stat_update, config.name)
            self._remotes[key] = Remote(getattr(config, which), config.remote_settings(), count)
        return self._remotes[key]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_remotes": {}}  # each process makes its own clients

    def open(
        self, source: int, path: str, size: int = -1, ahead_until: int = -1, version: str = ""
    ) -> BinaryIO:
        """A binary reader of an input: a local file, or a remote one by ranged requests
        (of its listed `version` only, when given: `Remote.open`)."""
        if not is_remote(path):
            return open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - the caller closes
        return self.remote(source).open(path, size, ahead_until=ahead_until, version=version)

    def opener(
        self, source: int, size: int = -1, ahead_until: int = -1, version: str = ""
    ) -> Callable[[str], BinaryIO]:
        """`open` for one source, size, read-ahead bound and listed version, as the stream
        functions take it."""
        return lambda path: self.open(source, path, size, ahead_until, version)
