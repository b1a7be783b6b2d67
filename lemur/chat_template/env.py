"""The Jinja sandbox chat templates run in: transformers' (`utils/chat_template_utils.py`,
`_cached_compile_jinja_template`), rebuilt so that rendering needs no transformers.

The same environment (`ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`,
`loopcontrols`), the same globals (`raise_exception`, `strftime_now`, a `dict` that
only builds dicts, a `namespace` refusing underscore attributes) and `tojson` filter
(no HTML escaping, `ensure_ascii=False`), and the `{% generation %}` tag, rendered as
its body (transformers uses it to track assistant text; lemur finds content by markers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lemur.tokenizer import TokenizerError


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: its body, as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        """The body as a call block whose method returns it unchanged."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def raise_exception(message: str) -> None:
    """What a template calls to refuse a conversation."""
    raise jinja2.exceptions.TemplateError(message)


def tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """JSON without Jinja's HTML escaping (transformers' override of `tojson`)."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class TemplateDict:
    """`dict(...)` for templates, without the attribute access of the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        """A new dict."""
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        """`dict.fromkeys`."""
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's `namespace`, refusing underscore-prefixed attributes (no way into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


def environment(clock: Callable[[], datetime]) -> ImmutableSandboxedEnvironment:
    """transformers' chat-template environment; `strftime_now` reads `clock`."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def compile_template(source: str, clock: Callable[[], datetime], where: str) -> jinja2.Template:
    """The compiled template; a TokenizerError naming `where` if it does not parse."""
    try:
        return environment(clock).from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TokenizerError(f"{where}: chat template line {e.lineno}: {e.message}") from None


def literal_text(template: jinja2.Template, source: str) -> str:
    """The template's literal strings (its text and string constants), NUL-separated:
    transformers' `_get_template_literal_text`, where it looks for control tokens."""
    ast = template.environment.parse(source)
    literals = {node.data for node in ast.find_all(jinja2.nodes.TemplateData)}
    literals |= {
        node.value for node in ast.find_all(jinja2.nodes.Const) if isinstance(node.value, str)
    }
    return "\0".join(sorted(literals))
