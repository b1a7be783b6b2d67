"""PII redaction of secrets where they really sit: env files, YAML, shell, JSON, HTTP headers
and code strings. Each secret is removed whole (no 8 characters of it survive), each counted
once, and look-alikes (git remotes, templated values, placeholders) stay byte-identical."""

from __future__ import annotations

import base64
import json
import random
import string
from pathlib import Path

import pytest
from conftest import real_python_files
from datatrove.data import Document

from lemur.data.filter.pii import PiiRedactor, redact
from lemur.data.filter.secrets import about_hashes, secret_settings
from lemur.data.recipe.filters import PiiConfig

B64 = string.ascii_letters + string.digits + "+/"
ALNUM = string.ascii_letters + string.digits
# Where a credential is written, by the name it is given there ({NAME} env, {name} config).
POSITIONS = {
    "env": "{NAME}={v}",
    "env_quoted": '{NAME}="{v}"',
    "shell": "export {NAME}={v}",
    "yaml": "  {name}: {v}",
    "yaml_quoted": "  {name}: '{v}'",
    "json": '  "{name}": "{v}",',
    "code": '{name} = "{v}"',
    "code_call": 'client = Client({name}="{v}", timeout=30)',
    "header": "Authorization: Bearer {v}",
    "curl": 'curl -sS -H "Authorization: token {v}" https://api.github.com/user',
}
# A bearer header carries tokens, not AWS keys or signing keys; curl only shaped tokens
# (detect-secrets reads a random string only when it is a whole quoted string).
NOT_IN = {
    "header": {"aws_id", "aws_secret", "hex"},
    "curl": {"aws_id", "aws_secret", "hex", "base64"},
}
LOOK_ALIKES = [
    "git clone git@github.com:lemur-org/lemur.git",
    "git remote add origin git@gitlab.com:group/sub-group/project.git",
    '    "url": "git+ssh://git@github.com/npm/cli.git"',
    "pip install git+ssh://git@gitlab.com/team/tool.git@v1.2.0",
    "  repo: ssh://git@bitbucket.org/team/repo.git",
    "GITHUB_TOKEN=${{ secrets.GITHUB_TOKEN }}",
    "AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}",
    "export AWS_SECRET_ACCESS_KEY=$(cat /run/secrets/aws_secret_key_2)",
    "  secret_access_key: !Ref SecretAccessKeyParameter",
    "  api_key: your_api_key_here_12345678",
    "Authorization: Bearer $ACCESS_TOKEN_2",
    "token_url: https://oauth2.googleapis.com/token",
    "SECRET_KEY_FILE=/run/secrets/django_secret_key_2",
    "  password_min_length: 12",
    "ghp_token_name = load_token_20(config)",
    "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "  aws_region: eu-central-1",
]


def credentials(rng: random.Random) -> dict[str, tuple[str, str]]:
    """Each kind's (env name, secret value), random."""

    def r(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    claims = json.dumps({"sub": r(ALNUM, 12), "iat": rng.randrange(1_600_000_000, 1_800_000_000)})
    payload = base64.urlsafe_b64encode(claims.encode()).rstrip(b"=").decode()
    url64 = ALNUM + "-_"
    return {
        "github": ("GITHUB_TOKEN", rng.choice(["ghp_", "gho_", "ghs_"]) + r(ALNUM, 36)),
        "aws_id": ("AWS_ACCESS_KEY_ID", "AKIA" + r(string.ascii_uppercase + "234567", 16)),
        "aws_secret": ("AWS_SECRET_ACCESS_KEY", r(B64, 40)),
        "slack": (
            "SLACK_BOT_TOKEN",
            f"xoxb-{r(string.digits, 12)}-{r(string.digits, 13)}-{r(ALNUM, 24)}",
        ),
        "stripe": ("STRIPE_SECRET_KEY", "sk_live_" + r(ALNUM, 24)),
        "sendgrid": ("SENDGRID_API_KEY", f"SG.{r(url64, 22)}.{r(url64, 43)}"),
        "jwt": ("ACCESS_TOKEN", f"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{payload}.{r(url64, 43)}"),
        "base64": ("SESSION_SECRET", r(B64, 44)),
        "hex": ("SIGNING_KEY", r("0123456789abcdef", 40)),
    }


def planted_lines(seed: int) -> list[tuple[str, str]]:
    """(line, secret) for every kind in every position where it occurs, fresh values each."""
    rng = random.Random(seed)
    out = []
    for position, template in POSITIONS.items():
        for kind, (name, value) in credentials(rng).items():
            if kind not in NOT_IN.get(position, ()):
                out.append((template.format(NAME=name, name=name.lower(), v=value), value))
    return out


def shell_scripts(n: int) -> list[Path]:
    """Real shell scripts of this machine (extension-less /usr/bin files with a sh shebang)."""
    found = []
    for p in sorted(Path("/usr/bin").iterdir()):
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 200_000:
            with p.open("rb") as f:
                head = f.read(32)
            if head.startswith(b"#!") and b"sh" in head.split(b"\n")[0]:
                found.append(p)
        if len(found) == n:
            break
    return found


@pytest.fixture(scope="module")
def hosts() -> list[tuple[str, str]]:
    """Real code and shell files with no PII of their own (so any change is ours)."""
    out = []
    with secret_settings():
        for p in real_python_files(12) + shell_scripts(12):
            text = p.read_text(encoding="utf-8", errors="replace")
            if not redact(text, "probe")[1] and not about_hashes(text):
                out.append((p.name, text))
    assert len(out) >= 12
    return out


def plant(text: str, lines: list[str]) -> str:
    """`lines` inserted at evenly spaced line breaks of a real file."""
    parts = text.split("\n")
    step = max(1, len(parts) // (len(lines) + 1))
    for i, line in reversed(list(enumerate(lines, 1))):
        parts.insert(min(i * step, len(parts)), line)
    return "\n".join(parts)


def survivors(out: str, value: str) -> list[str]:
    """The 8-character pieces of `value` still in `out`."""
    return [value[i : i + 8] for i in range(len(value) - 7) if value[i : i + 8] in out]


def test_every_secret_is_removed_whole_and_counted_once(hosts):
    planted = planted_lines(20261125)
    assert len(planted) == 83
    with secret_settings():
        for i, (line, value) in enumerate(planted):
            name, host = hosts[i % len(hosts)]
            doc = plant(host, [line])
            out, done = redact(doc, name)
            assert not survivors(out, value), line
            assert out == doc.replace(value, "<KEY>"), line
            assert [r.kind for r in done] == ["key"], line


def test_many_secrets_in_one_file_each_counted(hosts):
    planted = planted_lines(7)[::3]
    name, host = hosts[0]
    doc = plant(host, [line for line, _ in planted])
    with secret_settings():
        out, done = redact(doc, name)
    expected = doc
    for _, value in planted:
        expected = expected.replace(value, "<KEY>")
    assert out == expected
    assert len(done) == len(planted) == out.count("<KEY>")


@pytest.mark.parametrize("line", LOOK_ALIKES)
def test_look_alikes_stay_byte_identical(hosts, line):
    name, host = hosts[len(line) % len(hosts)]
    doc = plant(host, [line])
    with secret_settings():
        assert redact(doc, name) == (doc, [])


def test_report_counts_what_was_removed(tmp_path, hosts):
    planted = planted_lines(99)[::5]
    name, host = hosts[1]
    doc = plant(host, [line for line, _ in planted] + ["git clone git@github.com:o/r.git"])
    step = PiiRedactor(PiiConfig(report=str(tmp_path / "report")))
    docs = [Document(text=doc, id="c/1", metadata={"source": "c", "domain": "code"})]
    out = list(step.run(iter(docs), rank=0))[0].text
    rows = (tmp_path / "report" / "00000.jsonl").read_text().splitlines()
    assert step.stats.stats["pii:c:key"].total == len(rows) == len(planted)
    assert "pii:c:email" not in step.stats.stats
    assert not [s for _, v in planted for s in survivors(out, v)]
    assert "git clone git@github.com:o/r.git" in out
