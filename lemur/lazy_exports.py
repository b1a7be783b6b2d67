"""Package-level names that import their defining module on first use (PEP 562).

`lemur.data`, `lemur.train` and `lemur.eval` re-export their public names this way, so
that importing a package (e.g. for `lemur.eval.sandbox`) does not pull in JAX.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """(`__getattr__`, `__all__`) of `package` for `exports` (name -> submodule)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__, sorted(exports)
