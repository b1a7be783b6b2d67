"""Map YAML data onto typed, frozen dataclasses, with one-line errors naming the key.

Shared by the build recipe (`lemur.data.recipe`) and the trainer config
(`lemur.train.config`): unknown keys, missing keys and wrong types raise the caller's
error class with messages like `recipe: mix.total_tokens must be a number, got 'abc'`.
We hand-write this (rather than use pydantic) to keep plain frozen dataclasses, which jit
and pickle cleanly, and exact one-line messages.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from lemur.cli_common import UserError, parse_set


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


class TypedLoader:
    """Builds dataclasses from mappings, raising `error(f"{label}: ...")` on bad input."""

    def __init__(self, error: type[Exception], label: str) -> None:
        self.error = error
        self.label = label

    def _fail(self, message: str) -> Exception:
        return self.error(f"{self.label}: {message}")

    def coerce(self, value: Any, tp: Any, key: str) -> Any:
        """Convert a YAML value to the annotated type, or raise naming `key`."""
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in typing.get_args(tp):
                return None
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            return self.coerce(value, inner, key)
        if tp is Any:
            return value
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise self._fail(f"{key} must be a mapping, got {value!r}")
            return self.build(tp, value, key)
        if origin is list:
            (item_tp,) = typing.get_args(tp)
            if not isinstance(value, list):
                # `--set data.dirs=out/demo` or `paths: x` mean a one-element list.
                if isinstance(value, dict) or value is None:
                    raise self._fail(f"{key} must be a list, got {value!r}")
                value = [value]
            return [self.coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        if origin is dict:
            _, val_tp = typing.get_args(tp)
            if not isinstance(value, dict):
                raise self._fail(f"{key} must be a mapping, got {value!r}")
            return {str(k): self.coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
        if tp is bool:
            if not isinstance(value, bool):
                raise self._fail(f"{key} must be true or false, got {value!r}")
            return value
        if tp is int or tp is float:
            # YAML 1.1 reads `90e9` or `4e-5` as strings; accept what Python reads as a number.
            num = value
            if isinstance(value, str):
                try:
                    num = float(value.replace("_", ""))
                except ValueError:
                    num = None
            if isinstance(num, bool) or not isinstance(num, int | float):
                raise self._fail(f"{key} must be {_type_name(tp)}, got {value!r}")
            # `.inf`, `.nan` (YAML) or 'inf' (a string float() reads) mean no sensible
            # count, rate or weight: refuse them here rather than fail later in arithmetic.
            finite = math.isfinite(num)
            if tp is int:
                if not finite or float(num) != int(num):
                    raise self._fail(f"{key} must be an integer, got {value!r}")
                return int(num)
            if not finite:
                raise self._fail(f"{key} must be a finite number, got {value!r}")
            return float(num)
        if tp is str:
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise self._fail(f"{key} must be a string, got {value!r}")
            return str(value)
        raise TypeError(f"unsupported {self.label} type {tp} at {key}")

    def build(self, cls: type, raw: dict[str, Any], prefix: str = "") -> Any:
        """Instantiate dataclass `cls` from a mapping, checking keys and types recursively."""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(map(str, raw)) - set(fields))
        if unknown:
            where = f"{prefix}." if prefix else ""
            raise self._fail(
                f"unknown key '{where}{unknown[0]}' (known: {', '.join(sorted(fields))})"
            )
        kwargs = {}
        for name, f in fields.items():
            key = f"{prefix}.{name}" if prefix else name
            if name in raw:
                kwargs[name] = self.coerce(raw[name], hints[name], key)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise self._fail(f"missing key '{key}'")
        return cls(**kwargs)


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], error: type[Exception]
) -> dict[str, Any]:
    """Apply `a.b=value` overrides in place (values parsed as YAML; list items by index)."""
    for item in overrides:
        try:
            parts, value = parse_set(item)
        except UserError as e:
            raise error(str(e)) from None
        dotted = ".".join(parts)
        node: Any = raw
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise error(f"--set {dotted}: no list item {part!r}")
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise error(f"--set {dotted}: '{'.'.join(parts[:i])}' is not a mapping")
    return raw
