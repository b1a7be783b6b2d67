"""The code blocks of README.md and docs/*.md work as written.

- ```python blocks run, in order per file, in a directory where `out/demo`, `out/corpus`,
  `out/code` and `out/text` are a real (small) shard directory;
- ```json blocks parse; ```yaml blocks that are recipe fragments validate as a recipe;
- every `lemur-data ...` / `lemur-train ...` / `lemur-convert ...` command line in a shell
  block parses with the real argument parser, names a shipped config or an existing file
  where it names one, and every `python tools/X.py` names an existing tool.

A block that is deliberately not runnable (output, a layout, a sketch) uses a plain ```
fence, or is preceded by `<!-- docs-test: skip REASON -->`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(<!-- docs-test: skip[^>]*-->\s*\n)?```(\w*)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[str, int, str]]:
    """(file, line, code) of every not-skipped block fenced as `lang`."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group(2) == lang and not m.group(1):
                line = text.count("\n", 0, m.start(2)) + 1
                found.append((path.relative_to(ROOT).as_posix(), line, m.group(3)))
    return found


def shell_commands() -> list[tuple[str, int, list[str]]]:
    """Every lemur command line in bash or plain blocks, continuation lines joined."""
    out = []
    for lang in ("bash", "", "sh"):
        for where, line, code in blocks(lang):
            for cmd in code.replace("\\\n", " ").splitlines():
                cmd = cmd.split("  #")[0].split(" # ")[0].strip()
                for prefix in (".venv/bin/", "$(BIN)/"):
                    cmd = cmd.removeprefix(prefix)
                if re.match(r"(lemur-(data|train|convert)|python3? tools/\S+)(\s|$)", cmd):
                    out.append((where, line, shlex.split(cmd)))
    return out


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    """A directory whose out/{demo,corpus,code,text} are one real small shard directory."""
    from test_train_loop import build_corpus

    root = tmp_path_factory.mktemp("docs")
    built = build_corpus(root / "build")
    (root / "out").mkdir()
    for name in ("demo", "corpus", "code", "text"):
        (root / "out" / name).symlink_to(built, target_is_directory=True)
    return root


PYTHON_FILES = sorted({where for where, _, _ in blocks("python")})


@pytest.mark.parametrize("where", PYTHON_FILES)
def test_python_blocks_run(where: str, demo_root: Path) -> None:
    namespace: dict = {"__name__": "__docs__"}
    cwd = os.getcwd()
    os.chdir(demo_root)
    try:
        for _, line, code in [b for b in blocks("python") if b[0] == where]:
            try:
                exec(compile(code, f"{where}:{line}", "exec"), namespace)  # noqa: S102
            except Exception as e:  # noqa: BLE001 - name the block that failed
                pytest.fail(f"{where}:{line}: {type(e).__name__}: {e}")
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("where, line, code", blocks("json"), ids=lambda x: str(x)[:30])
def test_json_blocks_parse(where: str, line: int, code: str) -> None:
    json.loads(code)


@pytest.mark.parametrize("where, line, code", blocks("yaml"), ids=lambda x: str(x)[:30])
def test_yaml_blocks_are_valid_recipe_fragments(
    where: str, line: int, code: str, tmp_path: Path
) -> None:
    from lemur.data.demo import demo_recipe
    from lemur.data.recipe_loader import recipe_from_dict

    fragment = yaml.safe_load(code)
    raw = {**demo_recipe(str(tmp_path / "out")), **fragment}
    recipe_from_dict(raw, check_paths=False)


@pytest.mark.parametrize("where, line, argv", shell_commands(), ids=lambda x: str(x)[:40])
def test_shell_commands_parse(where: str, line: int, argv: list[str]) -> None:
    if argv[0].startswith("python"):
        assert (ROOT / argv[1]).is_file(), f"{where}:{line}: no such tool {argv[1]}"
        return
    if argv[0] == "lemur-data":
        from lemur.data.cli import parser

        args = parser().parse_args(argv[1:])
        recipe = getattr(args, "recipe", None)
        assert recipe is None or (ROOT / recipe).is_file(), f"{where}:{line}: {recipe}"
        return
    if argv[0] == "lemur-convert":
        from lemur.convert.cli import parser as convert_parser

        convert_parser().parse_args(argv[1:])
        return
    from lemur.train.cli import plot_parser, train_parser
    from lemur.train.config import shipped_configs

    if argv[1] == "plot":
        plot_parser().parse_args(argv[2:])
        return
    if argv[1] == "plan":
        from lemur.train.plan_cli import plan_parser

        args = plan_parser().parse_args(argv[2:])
    else:
        args = train_parser().parse_args(argv[1:])
    assert args.config in shipped_configs() or args.config.endswith(".yaml"), (
        f"{where}:{line}: {args.config} is neither a shipped config nor a YAML file"
    )
