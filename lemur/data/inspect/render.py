"""The inspect page as one self-contained HTML file: page.css and page.js (package data files)
inlined, the gathered data embedded as JSON in a `<script type="application/json">` block,
and a Content-Security-Policy that lets only those two inline blocks run or style, and no
request leave the page.

Hostile text stays text twice over: the JSON is escaped so that no document can end its
block (`<`, `>`, `&`, U+2028/2029 and lone surrogates as `\\u` escapes), and page.js puts
document text on the page with `textContent` only, never as HTML.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from lemur.atomic_files import atomic_write_text

# Characters that could close the data block or start markup, and the two that end a line
# in older JavaScript; lone surrogates cannot be written as UTF-8 at all.
_UNSAFE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def _escape_char(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def embed_json(data: Any) -> str:
    """`data` as JSON safe inside `<script type="application/json">`: no `<`, `>` or `&`
    as themselves, so that `</script>` or `<!--` in a document cannot end the block."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _UNSAFE.sub(_escape_char, text)


def asset(name: str) -> str:
    """A package data file of the page (page.js, page.css), as text."""
    return resources.files("lemur.data.inspect").joinpath(name).read_text(encoding="utf-8")


def csp_hash(source: str) -> str:
    """The CSP source expression allowing exactly this inline script or style."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def content_security_policy(script: str, style: str) -> str:
    """Nothing may load or connect; only the page's own inline script and style apply."""
    return (
        f"default-src 'none'; script-src {csp_hash(script)}; style-src {csp_hash(style)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def render(data: dict[str, Any]) -> str:
    """The page's HTML for the data `page.gather` made."""
    script, style = asset("page.js"), asset("page.css")
    title = html.escape(f"lemur-data inspect: {data.get('name', '')}")
    csp = content_security_policy(script, style)  # quotes ', base64 and ; only: no escaping
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{title}</title>\n"
        f"<style>{style}</style>\n</head>\n<body>\n"
        "<noscript>This page draws itself with JavaScript.</noscript>\n"
        f'<script type="application/json" id="lemur-data">{embed_json(data)}</script>\n'
        f"<script>{script}</script>\n</body>\n</html>\n"
    )


def write_page(path: str | os.PathLike[str], page: str) -> Path:
    """Write the page atomically (a killed run leaves no half page); its path."""
    atomic_write_text(path, page)
    return Path(path)
