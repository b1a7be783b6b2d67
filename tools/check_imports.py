"""Import every module of `lemur`: run from a base install (no extras) by `.ci/run`.

A module that needs a package only the dev extras bring in fails here, naming the module
and the missing package, before a user meets it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import lemur


def main() -> int:
    """Import each module; print every failure and return 1 if there was one."""
    failures = []
    names = [m.name for m in pkgutil.walk_packages(lemur.__path__, "lemur.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - report every module, then fail
            failures.append(f"{name}: {type(e).__name__}: {e}")
    for line in failures:
        print(f"check_imports: {line}", file=sys.stderr)
    print(f"check_imports: {len(names) - len(failures)}/{len(names)} modules import")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
