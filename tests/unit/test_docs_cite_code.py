"""Every repository path, Python module and code name the READMEs and docs/ cite exists.

test_docs_links.py checks the Markdown links; this checks the code the prose names outside
links, in text and code spans (fenced blocks apart: examples and recorded output):

- repository paths (`operator/autoglm_operator/io/prom.py`, `hack/k8s-bin.sh`, `charts/...`):
  the file or folder exists. A path under a package's name (`autoglm_runtime/launcher.py`) is
  read from that package's folder. Placeholders (`tests/<tier>/`, `docs/benchmarks/NAME.md`)
  and globs are not paths;
- dotted module names (`autoglm_operator.io.prom`, `testkit.report.results_page`): the longest
  importable prefix is a module and the rest its attributes (a class's fields count);
- a code name with the file it is in, written "`NAME` in `path`" or "`path`'s `NAME`": every
  part of NAME is a word of that file.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from test_docs_links import FENCE, PAGES

REPO = Path(__file__).resolve().parents[2]
# The top-level folders and files a cited path can start with: what the repository tracks.
TOP = ("api", "bench", "charts", "crds", "docs", "examples", "hack", "images", "operator",
       "router", "runtime", "testkit", "tests", ".ci", "Makefile", "pyproject.toml",
       "kind-config.yaml")  # fmt: skip
# Paths the docs cite in another project's tree, which start like one of ours.
NOT_OURS = {
    "api/openapi-spec/v3",  # Kubernetes' source (docs/reference/resource-notes.md)
    "docs/features/sleep_mode.md",  # vLLM's (runtime/README.md)
    "docs/source/use_cases/autoscaling-keda.rst",  # vLLM production-stack's (scale_to_zero.md)
}
# Each package's folder: a path may start at the package (`autoglm_runtime/launcher.py`).
PACKAGES = {"autoglm_api": "api", "autoglm_operator": "operator", "autoglm_runtime": "runtime",
            "autoglm_router": "router", "testkit": "testkit"}  # fmt: skip
MODULE = re.compile(r"(?<![\w./-])(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./<>$-])((?:" + "|".join(map(re.escape, (*TOP, *PACKAGES)))
                  + r")(?:/[\w.@+-]*)*)")  # fmt: skip
# A Markdown link, whose target test_docs_links.py checks and whose text is often a path
# relative to the page (`[runtime/profiles.md](runtime/profiles.md)` in docs/).
LINK = re.compile(r"\[[^\]]*\]\([^)\s]+\)")
NAME = r"`(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`"
WHERE = r"`(?P<path>[\w./-]+\.\w+)`"
NAME_IN = re.compile(NAME + r" in " + WHERE)
NAME_OF = re.compile(WHERE + r"'s " + NAME)


def prose(text: str) -> str:
    """The text outside fenced blocks and links (test_docs_links.py's), where citations are
    read."""
    return LINK.sub(" ", FENCE.sub("", text))


def resolve(path: str) -> Path | None:
    """The checkout's file or folder a cited path names, None when there is none."""
    path = path.rstrip("/")
    candidates = [REPO / path]
    first = path.split("/", 1)[0]
    if first in PACKAGES:
        candidates.append(REPO / PACKAGES[first] / path)
    return next((c for c in candidates if c.exists()), None)


def cited_paths(text: str) -> list[str]:
    found: list[str] = []
    for match in PATH.finditer(prose(text)):
        path = match[1].rstrip(".,:;")
        if "/" not in path:
            continue  # a word of prose: the router, testkit, the Makefile
        if match.string[match.end(1):match.end(1) + 1] in ("<", "*", "{", "$"):
            continue  # a placeholder or a glob follows: `tests/<tier>/`, `hack/*.sh`
        if path in NOT_OURS:
            continue
        if any(part.isupper() and len(part) > 1 for part in re.split(r"[/.]", path)):
            continue  # a placeholder in capitals: docs/benchmarks/NAME.md
        found.append(path)
    return found


def cited_modules(text: str) -> list[str]:
    return [m[0] for m in MODULE.finditer(prose(text))]


def cited_names(text: str) -> list[tuple[str, str]]:
    spans = prose(text)
    return [(m["name"], m["path"])
            for pattern in (NAME_IN, NAME_OF) for m in pattern.finditer(spans)]


def _module(name: str) -> ModuleType | None:
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None
    return importlib.import_module(name)


def _has(owner: object, attribute: str) -> bool:
    if hasattr(owner, attribute):
        return True
    fields = [getattr(owner, "model_fields", None) or {},  # pydantic
              getattr(owner, "__dataclass_fields__", None) or {}]  # fmt: skip
    fields += [getattr(k, "__annotations__", {}) for k in getattr(owner, "__mro__", ())]
    return any(attribute in f for f in fields)


def module_resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module(".".join(parts[:cut]))
        if module is None:
            continue
        owner: object = module
        for attribute in parts[cut:]:
            if not _has(owner, attribute):
                return False
            owner = getattr(owner, attribute, None)
        return True
    return False


def problems(text: str) -> list[str]:
    """What a page's text cites that the checkout lacks, one line each."""
    found = [f"no such path: {p}" for p in dict.fromkeys(cited_paths(text)) if resolve(p) is None]
    found += [f"does not resolve: {m}" for m in dict.fromkeys(cited_modules(text))
              if not module_resolves(m)]  # fmt: skip
    for name, path in dict.fromkeys(cited_names(text)):
        where = resolve(path)
        if where is None or not where.is_file():
            continue  # a path the first check reports, or a name cited in a folder
        words = set(re.findall(r"\w+", where.read_text(errors="replace")))
        if not set(name.split(".")) <= words:
            found.append(f"not in {path}: {name}")
    return found


def test_the_pages_cite_code_to_check() -> None:
    texts = [page.read_text() for page in PAGES]
    assert sum(len(cited_paths(t)) for t in texts) > 100
    assert sum(len(cited_modules(t)) for t in texts) > 10
    assert sum(len(cited_names(t)) for t in texts) >= 3


def test_a_renamed_module_path_or_name_is_reported() -> None:
    text = """
The router decides with `autoglm_router.routing.decide` (router/autoglm_router/routing.py),
not `autoglm_router.routng.decide` nor autoglm_router.routing.decidee; see
`router/autoglm_router/routng.py`, `autoglm_router/routing.py` and `autoglm_router/routng.py`.
`decide` in `router/autoglm_router/routing.py`; `routing.py`'s `decide`;
`decidee` in `router/autoglm_router/routing.py`.

```
router/autoglm_router/in_a_fence.py
```
"""
    assert problems(text) == [
        "no such path: router/autoglm_router/routng.py",
        "no such path: autoglm_router/routng.py",
        "does not resolve: autoglm_router.routng.decide",
        "does not resolve: autoglm_router.routing.decidee",
        "not in router/autoglm_router/routing.py: decidee",
    ]


def test_placeholders_and_words_are_not_paths() -> None:
    text = ("`tests/<tier>/` holds a tier; `git log -p docs/benchmarks/NAME.md`; `hack/*.sh`; "
            "the router and the runtime; testkit, docs and bench. `make test`.")
    assert cited_paths(text) == []


def test_a_field_of_a_class_resolves() -> None:
    assert module_resolves("testkit.report.results_page")
    assert module_resolves("autoglm_router.routing.decide")
    assert not module_resolves("autoglm_router.routing.no_such_name")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_module_and_name_exists(page: Path) -> None:
    assert problems(page.read_text()) == []
