"""Every third-party module the package imports is declared in pyproject.toml.

A runtime dependency that only arrives through the dev extras (as `regex` once did, through
`transformers`) passes the suite and breaks the demo for every new user. `.ci/run` also runs
the demo and imports every module from a base install; this test names the culprit.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Imported only inside a function, for an optional feature: module -> why it is optional.
OPTIONAL = {
    "ray": "the `ray` executor (extra: ray)",
    "torch": "TensorBoard output through torch's writer, tried after tensorboardX",
    "tensorboardX": "TensorBoard output (optional writer)",
    "lm_eval": "`lemur-eval harness` and the training loop's eval.harness (extra: harness)",
}
# Imported by the package but needed only because a dependency fails to declare it.
UNDECLARED_BY_OTHERS = {"regex": "datatrove.utils.text imports it; datatrove 0.10 omits it"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """Base dependencies and each extra's, as normalized distribution names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return {_name(r) for r in project["dependencies"]}, extras


def imports(top_level_only: bool) -> dict[str, str]:
    """Top-level third-party module -> first file importing it (module level only if asked)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "lemur").rglob("*.py")):
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else ast.walk(tree)
        for node in nodes:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                # A script run by path (lemur/eval/sandbox/jail.py) imports the module beside it.
                beside = (path.parent / f"{top}.py").is_file()
                if top != "lemur" and top not in sys.stdlib_module_names and not beside:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def distributions(module: str) -> list[str]:
    """The installed distributions that provide a top-level module (`fasttext`: both
    fasttext-predict and the training wheel of the `classifier` extra)."""
    return [d.lower().replace("_", "-") for d in md.packages_distributions().get(module) or []]


def test_every_imported_module_is_a_declared_dependency() -> None:
    base, _ = declared()
    missing = []
    for module, where in imports(top_level_only=False).items():
        if module in OPTIONAL:
            continue
        dists = distributions(module)
        if not set(dists) & base:
            missing.append(f"{module} ({dists or 'not installed'}), imported in {where}")
    assert not missing, "undeclared runtime dependencies: " + "; ".join(missing)


def test_optional_modules_are_imported_lazily_and_declared_somewhere() -> None:
    top = imports(top_level_only=True)
    assert not set(OPTIONAL) & set(top), "optional modules must be imported inside functions"
    _, extras = declared()
    assert "ray" in extras["ray"]


def test_dependencies_our_dependencies_forget_are_declared() -> None:
    base, _ = declared()
    for module in UNDECLARED_BY_OTHERS:
        assert set(distributions(module)) & base


def _requirements(extra: str) -> dict[str, str]:
    """The dev extra's (or base, with extra "") requirement strings by distribution name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {_name(r): r for r in reqs}


def test_boto3_and_aiobotocore_ranges_agree_so_pip_never_walks_back() -> None:
    """s3fs -> aiobotocore pins botocore to a few patch releases; moto pulls boto3. Unbounded,
    pip walked back through 60 aiobotocore and 22 boto3/botocore releases on a fresh machine
    (29 minutes on a loaded one). Both are bounded in the dev extra, and the installed set is
    what those bounds meant: aiobotocore's botocore range holds boto3's botocore."""
    from packaging.requirements import Requirement

    dev = _requirements("dev")
    bounds = {}
    for name in ("boto3", "aiobotocore"):
        assert name in dev, f"the dev extra does not bound {name}"
        spec = Requirement(dev[name]).specifier
        assert any(s.operator in ("<", "<=", "==", "~=") for s in spec), (
            f"{name} has no upper bound"
        )
        bounds[name] = spec
        assert bounds[name].contains(md.version(name)), (name, md.version(name), str(spec))
    botocore_of = {
        name: next(
            Requirement(r).specifier
            for r in md.requires(name) or []
            if _name(r) == "botocore" and "extra ==" not in r
        )
        for name in ("boto3", "aiobotocore")
    }
    assert botocore_of["aiobotocore"].contains(md.version("botocore"))
    assert botocore_of["boto3"].contains(md.version("botocore"))
