"""The pinned vLLM's own source, as the judge of which `vllm serve` flags exist.

Downloads the vLLM sdist named by PINNED_VLLM_VERSION from PyPI's simple index into a cache
outside the repo (`${AUTOGLM_CACHE:-$HOME/.cache/autoglm}/vllm-src/<version>/`), checks the
sha256 the index publishes, and reads the flags by parsing the source (never importing it:
vLLM needs a GPU stack to import):

- fields of the EngineArgs / AsyncEngineArgs dataclasses (vllm/engine/arg_utils.py) and of
  BaseFrontendArgs / FrontendArgs (vllm/entrypoints/common/cli_args.py) become `--field-name`,
  with a `--no-` form for bool fields (argparse.BooleanOptionalAction);
- every literal `add_argument("--...")` string in vllm/entrypoints and vllm/engine.

Usage: `python hack/vllm_source.py [--version X] [--reasoning-parsers]` prints the set.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import html.parser
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from functools import cache
from pathlib import Path

SIMPLE_INDEX = "https://pypi.org/simple/vllm/"
# Only these trees are read; extracting the rest of the sdist would be wasted disk.
SOURCE_DIRS = ("vllm/engine/", "vllm/entrypoints/", "vllm/reasoning/")
DATACLASS_ARGS = {
    "vllm/engine/arg_utils.py": ("EngineArgs", "AsyncEngineArgs"),
    "vllm/entrypoints/common/cli_args.py": ("BaseFrontendArgs", "FrontendArgs"),
}


def pinned_version() -> str:
    from autoglm_runtime.engine_args import PINNED_VLLM_VERSION

    return PINNED_VLLM_VERSION


def cache_root() -> Path:
    base = os.environ.get("AUTOGLM_CACHE") or str(Path.home() / ".cache" / "autoglm")
    return Path(base) / "vllm-src"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def sdist_link(version: str) -> tuple[str, str]:
    """(url, sha256) of `vllm-<version>.tar.gz` from the simple index."""
    request = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=60) as response:
        page = response.read().decode("utf-8")
    links = _Links()
    links.feed(page)
    wanted = f"vllm-{version}.tar.gz"
    for href in links.hrefs:
        url, _, fragment = urllib.parse.urljoin(SIMPLE_INDEX, href).partition("#")
        if url.rsplit("/", 1)[-1] == wanted:
            algo, _, digest = fragment.partition("=")
            if algo != "sha256" or not digest:
                raise RuntimeError(f"{wanted}: the index gives no sha256 ({fragment!r})")
            return url, digest
    raise RuntimeError(f"{wanted} is not on {SIMPLE_INDEX}")


def source_dir(version: str | None = None) -> Path:
    """The extracted source tree (cached), downloading and verifying it on first use."""
    version = version or pinned_version()
    target = cache_root() / version
    tree = target / "src"
    if (target / "complete").exists():
        return tree
    target.mkdir(parents=True, exist_ok=True)
    url, digest = sdist_link(version)
    archive = target / f"vllm-{version}.tar.gz"
    if not archive.exists() or _sha256(archive) != digest:
        print(f"Downloading {url}", file=sys.stderr)
        with (
            tempfile.NamedTemporaryFile(dir=target, delete=False) as tmp,
            urllib.request.urlopen(url, timeout=300) as response,
        ):
            shutil.copyfileobj(response, tmp)
        if _sha256(Path(tmp.name)) != digest:
            os.unlink(tmp.name)
            raise RuntimeError(f"sha256 mismatch for {url}: expected {digest}")
        os.replace(tmp.name, archive)
    # Extract beside, then rename: a concurrent or interrupted run never sees half a tree.
    staging = Path(tempfile.mkdtemp(dir=target))
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            inner = member.name.split("/", 1)[1] if "/" in member.name else ""
            if member.isfile() and inner.endswith(".py") and inner.startswith(SOURCE_DIRS):
                member.name = inner
                members.append(member)
        tar.extractall(staging, members=members, filter="data")
    if tree.exists():
        shutil.rmtree(tree)
    os.replace(staging, tree)
    (target / "complete").write_text(digest)
    return tree


def _sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def _is_bool(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        isinstance(node, ast.Name) and node.id == "bool" for node in ast.walk(annotation)
    )


def _dataclass_flags(tree: ast.Module, class_names: tuple[str, ...]) -> set[str]:
    flags: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in class_names:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if name.startswith("_") or "ClassVar" in ast.unparse(item.annotation):
                        continue
                    flag = "--" + name.replace("_", "-")
                    flags.add(flag)
                    if _is_bool(item.annotation):
                        flags.add("--no-" + flag[2:])
    return flags


def _literal_flags(tree: ast.Module) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        boolean = any(
            kw.arg == "action" and "BooleanOptionalAction" in ast.unparse(kw.value)
            for kw in node.keywords
        )
        for name in names:
            if name.startswith("--"):
                flags.add(name)
                if boolean:
                    flags.add("--no-" + name[2:])
    return flags


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def vllm_serve_flags(version: str | None = None) -> frozenset[str]:
    """Every long flag `vllm serve` of this version accepts (a superset: see the module doc)."""
    root = source_dir(version)
    flags: set[str] = set()
    for relative, classes in DATACLASS_ARGS.items():
        flags |= _dataclass_flags(_parse(root / relative), classes)
    for folder in ("vllm/entrypoints", "vllm/engine"):
        for path in sorted((root / folder).rglob("*.py")):
            flags |= _literal_flags(_parse(path))
    return frozenset(flags)


@cache
def reasoning_parsers(version: str | None = None) -> frozenset[str]:
    """Names `--reasoning-parser` accepts: the lazy registry plus decorator registrations."""
    root = source_dir(version) / "vllm" / "reasoning"
    names: set[str] = set()
    init = _parse(root / "__init__.py")
    for node in ast.walk(init):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(t, ast.Name) and t.id == "_REASONING_PARSERS_TO_REGISTER"
                for t in targets
            ) and isinstance(node.value, ast.Dict):
                names |= {
                    k.value
                    for k in node.value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
    for path in root.rglob("*.py"):
        for node in ast.walk(_parse(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "register_module"
            ):
                names |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                }
    return frozenset(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", default=None)
    parser.add_argument("--reasoning-parsers", action="store_true")
    args = parser.parse_args(argv)
    found = (
        reasoning_parsers(args.version)
        if args.reasoning_parsers
        else vllm_serve_flags(args.version)
    )
    print("\n".join(sorted(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
