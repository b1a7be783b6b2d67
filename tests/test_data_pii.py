"""PII redaction: planted e-mails, IPs and keys in real code files are replaced, ordinary code
is left alone, and nothing else in a document changes."""

from __future__ import annotations

import ipaddress
import json
import random
import socket
import string
import sysconfig
from pathlib import Path

import pytest
from conftest import real_python_files
from datatrove.data import Document

from lemur.data.filter.pii import (
    IPV6_PATTERN,
    PRIVATE_IPV4,
    PRIVATE_IPV6,
    PiiRedactor,
    ipv6_matches,
    redact,
    replacement_ip,
)
from lemur.data.filter.secrets import about_hashes, secret_settings
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.filters import PiiConfig
from lemur.data.recipe_loader import recipe_from_dict

STDLIB = Path(sysconfig.get_paths()["stdlib"])
B64 = string.ascii_letters + string.digits + "+/"
ALNUM = string.ascii_letters + string.digits


def secrets_planted(seed: int) -> list[tuple[str, str]]:
    """(line to plant, secret value) for each kind of key, random but reproducible."""
    rng = random.Random(seed)

    def r(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    aws_id = "AKIA" + r(string.ascii_uppercase + "234567", 16)
    aws_secret = r(B64, 40)
    github = "ghp_" + r(ALNUM, 36)
    slack = f"xoxb-{r(string.digits, 12)}-{r(string.digits, 13)}-{r(ALNUM, 24)}"
    stripe = "sk_live_" + r(ALNUM, 24)
    b64 = r(B64, 44)
    hexa = r("0123456789abcdef", 40)
    return [
        (f'AWS_ACCESS_KEY_ID = "{aws_id}"', aws_id),
        (f'aws_secret_access_key = "{aws_secret}"', aws_secret),
        (f'GITHUB_TOKEN = "{github}"', github),
        (f'SLACK_BOT_TOKEN = "{slack}"', slack),
        (f'stripe.api_key = "{stripe}"', stripe),
        (f'SESSION_SECRET = "{b64}"', b64),
        (f'signing_key = "{hexa}"', hexa),
    ]


EMAILS = ["jane.doe@gmail.com", "r.smith+dev@mail.example-corp.io", "ops_team@corp-mail.de"]
IPS = ["93.184.216.34", "151.101.1.69", "52.94.236.248", "2a00:1450:4001:82b::200e"]
LEFT_ALONE = [
    '__version__ = "1.2.3.4"',
    'VERSION = "10.0.19041.1"',
    "# from linux-2.6.16.60/include/asm/io.h",
    'tag = "v1.2.3.4"',
    "Release 4.4.0.21 notes",
    'host = "192.168.1.20"',
    'gateway = "10.0.0.1"',
    'loopback = "127.0.0.1"',
    'nat = "172.16.5.4"',
    'any6 = "::1"',
    'link = "fe80::1ff:fe23:4567:890a"',
    'ula = "fd12:3456:789a:1::1"',
    'documentation = "192.0.2.10"',
    'documentation6 = "2001:db8::1"',
    'mask = "255.255.255.0"',
    'resolver = "8.8.8.8"',
    'OID_SUBJECT_ALT_NAME = "2.5.29.17"',
    'MS_OID = "1.3.6.1.4.1.311.20.2"',
    'rsa = ObjectIdentifier("1.2.840.113549.1.1.11")',
    "// 23.3.5.2 bitset operations:",
    "def test_utf8_decode_invalid_sequences_2(self):",
    "__m512i r = _mm512_mask_cvtepi32_storeu_epi8(a, k, b);",
    'def int_hexagon : Intrinsic<"HEXAGON_V6_vgathermhwq_128B">;',
    'codec = "ISO8859_15"',
    'triple = "x86_64-linux-gnu"',
    'name = "ThisIsAnOrdinaryIdentifierName2"',
    'uid = "123e4567-e89b-12d3-a456-426614174000"',
    'chars = "abcdefghijklmnopqrstuvwxyz0123456789_"',
    'digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"',
    "@property",
    'icon = "icon@2x.png"',
    'address = "user@example.com"',
    "c = a@b",
    'pkg = "lodash@4.17.21"',
    'mac = "00:1a:2b:3c:4d:5e"',
    "std::vector<int> v;",
    'when = "2023-11-22T10:15:30Z"',
]


def hosts() -> list[tuple[str, str]]:
    """Real code files with no PII of their own (so that any change is ours), .py and .h."""
    found = []
    files = real_python_files(30) + sorted(Path("/usr/include").glob("*.h"))[:30]
    with secret_settings():
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            if not redact(text, "probe")[1] and not about_hashes(text):
                found.append((p.name, text))
    assert len(found) >= 20
    return found


def plant(text: str, lines: list[str]) -> str:
    """`lines` inserted at evenly spaced line breaks of a real file."""
    parts = text.split("\n")
    step = max(1, len(parts) // (len(lines) + 1))
    for i, line in reversed(list(enumerate(lines, 1))):
        parts.insert(min(i * step, len(parts)), line)
    return "\n".join(parts)


@pytest.fixture(scope="module")
def real_hosts() -> list[tuple[str, str]]:
    return hosts()


def test_planted_pii_is_replaced_and_the_rest_is_byte_identical(real_hosts):
    with secret_settings():
        for i, (name, host) in enumerate(real_hosts):
            keys = secrets_planted(i)
            lines = [line for line, _ in keys]
            lines += [f"# maintainer: {EMAILS[i % 3]}", f'SERVER = "{IPS[i % 4]}"']
            doc = plant(host, lines)
            out, done = redact(doc, name)
            expected = doc
            for _, value in keys:
                expected = expected.replace(value, "<KEY>")
            expected = expected.replace(EMAILS[i % 3], "<EMAIL>")
            expected = expected.replace(IPS[i % 4], replacement_ip(name, IPS[i % 4]))
            assert out == expected, name
            assert sorted(r.kind for r in done) == ["email", "ip"] + ["key"] * len(keys)


def test_private_key_blocks_lose_their_body(real_hosts):
    rng = random.Random(3)
    body = "\n".join("".join(rng.choice(B64) for _ in range(64)) for _ in range(5))
    block = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    name, host = real_hosts[0]
    with secret_settings():
        out, done = redact(plant(host, [f'KEY = """{block}"""']), name)
    assert body not in out and "-----BEGIN RSA PRIVATE KEY-----\n<KEY>\n-----END" in out
    assert [r.kind for r in done] == ["key"]


@pytest.mark.parametrize("line", LEFT_ALONE)
def test_ordinary_code_is_left_alone(real_hosts, line):
    name, host = real_hosts[len(line) % len(real_hosts)]
    doc = plant(host, [line])
    with secret_settings():
        assert redact(doc, name) == (doc, [])


def test_ipv6_scan_finds_what_the_full_regex_finds():
    """The colon-anchored scan gives exactly `IPV6_PATTERN.finditer`'s spans, on dense hex/colon
    noise (overlapping and adjacent candidates) and on real C++ headers full of `::`."""
    rng = random.Random(7)
    texts = ["".join(rng.choice("23aF0:: .\n") for _ in range(400)) for _ in range(300)]
    texts += [
        p.read_text(errors="replace") for p in sorted(Path("/usr/include").rglob("*.h"))[:200]
    ]
    texts += ["2001:db8::1", "x2a03:2880:f12f:83:face:b00c::25de", "3fff::1:2:3:4:5:6:7:8:9"]
    for text in texts:
        assert ipv6_matches(text) == [m.span() for m in IPV6_PATTERN.finditer(text)], text[:80]


def test_ip_replacement_is_private_and_fixed_per_document():
    assert all(not ipaddress.ip_address(a).is_global for a in PRIVATE_IPV4)
    assert all(ipaddress.ip_address(a).is_private for a in PRIVATE_IPV6)
    text = 'a = "93.184.216.34"\nb = "93.184.216.34"\nc = "2a00:1450:4001:82b::200e"\n'
    out, _ = redact(text, "doc-1", ("ip",))
    first, second, v6 = (line.split('"')[1] for line in out.splitlines())
    assert first == second == replacement_ip("doc-1", "93.184.216.34") and first in PRIVATE_IPV4
    assert v6 in PRIVATE_IPV6
    assert redact(text, "doc-1", ("ip",))[0] == out
    assert redact('for k, v in hosts: v = "93.184.216.34"', "d")[1]  # `v` is no version
    # keys are found without an open `secret_settings` too
    assert [r.kind for r in redact('t = "ghp_' + "a1B2c3D4" * 4 + 'e5F6"', "d")[1]] == ["key"]
    others = {replacement_ip(f"doc-{i}", "93.184.216.34") for i in range(40)}
    assert len(others) > 1  # documents get different ones


def test_detect_secrets_never_touches_the_network(real_hosts, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    name, host = real_hosts[1]
    keys = secrets_planted(7)
    with secret_settings():
        out, done = redact(plant(host, [line for line, _ in keys]), name)
    assert len(done) == len(keys) and not any(v in out for _, v in keys)


def test_step_counts_by_source_and_kind_and_reports_without_values(tmp_path, real_hosts):
    name, host = real_hosts[2]
    keys = secrets_planted(11)
    code = plant(host, [keys[0][0], "# jane.doe@gmail.com", 'ip = "93.184.216.34"'])
    docs = [
        Document(text=code, id="c/1", metadata={"source": "c", "domain": "code"}),
        Document(
            text="Write to jane.doe@gmail.com", id="t/1", metadata={"source": "t", "domain": "text"}
        ),
    ]
    step = PiiRedactor(PiiConfig(report=str(tmp_path / "report")))
    out = list(step.run(iter(docs), rank=3))
    assert out[1].text == "Write to jane.doe@gmail.com"  # text is off by default
    stats = {k: v.total for k, v in step.stats.stats.items() if k.startswith("pii:")}
    assert stats == {"pii:c:key": 1, "pii:c:email": 1, "pii:c:ip": 1}
    rows = [
        json.loads(line) for line in (tmp_path / "report" / "00003.jsonl").read_text().splitlines()
    ]
    lines = code.split("\n")
    assert {(r["id"], r["kind"]) for r in rows} == {("c/1", "key"), ("c/1", "email"), ("c/1", "ip")}
    for r in rows:
        assert r["source"] == "c"
        assert {"key": "AWS_ACCESS", "email": "jane.doe", "ip": "93.184"}[r["kind"]] in lines[
            r["line"] - 1
        ]
    raw = (tmp_path / "report" / "00003.jsonl").read_text()
    assert keys[0][1] not in raw and "jane.doe" not in raw and "93.184" not in raw


def test_a_failed_task_leaves_no_report_nor_temporary_file(tmp_path):
    def failing():
        yield Document(text="mail jane.doe@gmail.com", id="c/1", metadata={"domain": "code"})
        raise OSError("the source went away")

    step = PiiRedactor(PiiConfig(report=str(tmp_path / "report")))
    with pytest.raises(OSError, match="the source went away"):
        list(step.run(failing(), rank=0))
    assert list((tmp_path / "report").iterdir()) == []


def test_domains_are_configurable(tmp_path):
    doc = Document(
        text="mail jane.doe@gmail.com", id="t", metadata={"source": "t", "domain": "text"}
    )
    step = PiiRedactor(PiiConfig(domains=["code", "text"], kinds=["email"]))
    assert next(step.run(iter([doc]))).text == "mail <EMAIL>"


@pytest.mark.parametrize(
    "pii, message",
    [
        ({"kinds": ["email", "phone"]}, "'phone' is not one of email, ip, key"),
        ({"domains": ["co de"]}, "pii.domains"),
        ({"enabled": "yes"}, "pii.enabled must be true or false"),
        ({"reports": "x"}, "unknown key 'pii.reports'"),
    ],
)
def test_recipe_validation(tmp_path, pii, message):
    raw = {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {}},
        "mix": {"ratio": {"code": 1}},
        "sources": [{"name": "c", "domain": "code", "format": "files", "paths": [str(tmp_path)]}],
        "pii": pii,
    }
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(raw)
