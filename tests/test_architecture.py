"""The architecture, checked: who may import whom, and how long a module may grow.

Every `.py` file under `engines/`, `router/`, `classifier/` and `specroute/` (the generated gRPC stubs
`specroute/v1/*_pb2*` excepted) is parsed with `ast`; every import statement counts, wherever it stands
(module level, inside a function, under `if TYPE_CHECKING:`), and relative imports are resolved.

Layering:

* `engines/` (the PyTorch workers) never imports the gateway (`router`);
* `router/` (the gateway) never imports `torch` or the engines: it talks to them over gRPC only;
* `classifier/` (numpy only, runs inside the gateway) imports neither `router`, `engines` nor `torch`;
* `specroute/contracts/` (the shared contract types) imports none of `router`, `engines`, `torch`,
  `fastapi`, `grpc`.

Size: no module in `engines/` or `router/` is longer than `MAX_LINES` lines.

The map: `docs/ARCHITECTURE.md` names every module of `DOCUMENTED` (its full path anywhere; or, in its
package's section, its path inside the package, or its file name on a line that names its folder).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engines", "router", "classifier", "specroute")
MAX_LINES = 420
SIZE_CHECKED = ("engines", "router")
DOC = REPO / "docs" / "ARCHITECTURE.md"
# package -> the words of the heading of its section in docs/ARCHITECTURE.md
DOCUMENTED: dict[str, str] = {"router": "gateway wing", "engines": "engine wing", "classifier": "classifier",
                              "specroute": "system", "bench": "benchmarks"}

# (folder, relative to the repository) -> top-level modules it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "engines": frozenset({"router"}),
    "router": frozenset({"torch", "engines"}),
    "classifier": frozenset({"router", "engines", "torch"}),
    "specroute/contracts": frozenset({"router", "engines", "torch", "fastapi", "grpc"}),
}


def _is_generated(path: Path, repo: Path = REPO) -> bool:
    rel = path.relative_to(repo)
    return rel.parts[:2] == ("specroute", "v1") and "_pb2" in path.name


def source_files() -> list[Path]:
    files: list[Path] = []
    for pkg in PACKAGES:
        files += [p for p in sorted((REPO / pkg).rglob("*.py")) if not _is_generated(p)]
    return files


def _module_name(path: Path, repo: Path) -> tuple[str, bool]:
    """(dotted module name, is a package `__init__`) of a source file."""
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imported_modules(path: Path, repo: Path = REPO) -> list[tuple[int, str]]:
    """(line, absolute dotted module) of every import in a file, relative imports resolved, by line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name, is_package = _module_name(path, repo)
    package = name.split(".") if is_package else name.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                anchor = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            if node.module:
                out.append((node.lineno, base))
            else:  # `from . import x`: each name may be a module
                out += [(node.lineno, f"{base}.{alias.name}" if base else alias.name) for alias in node.names]
    return sorted(out)


def _layer_of(path: Path, repo: Path) -> str | None:
    rel = path.relative_to(repo).as_posix()
    # the most specific folder that has a rule
    for folder in sorted(FORBIDDEN, key=len, reverse=True):
        if rel.startswith(folder + "/"):
            return folder
    return None


def layering_violations(files: list[Path], repo: Path = REPO) -> dict[str, list[str]]:
    """folder -> ["path:line imports module", ...] for every forbidden import."""
    found: dict[str, list[str]] = {folder: [] for folder in FORBIDDEN}
    for path in files:
        folder = _layer_of(path, repo)
        if folder is None:
            continue
        for line, module in imported_modules(path, repo):
            if module.split(".")[0] in FORBIDDEN[folder]:
                found[folder].append(f"{path.relative_to(repo)}:{line} imports {module}")
    return found


def oversized(files: list[Path], limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in files:
        if path.relative_to(REPO).parts[0] in SIZE_CHECKED:
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(REPO)}: {n} lines")
    return out


@pytest.fixture(scope="module")
def files() -> list[Path]:
    found = source_files()
    assert len(found) > 20, "source tree not found"
    return found


@pytest.fixture(scope="module")
def violations(files: list[Path]) -> dict[str, list[str]]:
    """Every file parsed once for all the folders' checks."""
    return layering_violations(files)


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_layering(violations: dict[str, list[str]], folder: str):
    bad = violations[folder]
    allowed = ", ".join(sorted(FORBIDDEN[folder]))
    assert not bad, f"{folder}/ must not import {allowed}:\n" + "\n".join(bad)


def test_module_size(files: list[Path]):
    bad = oversized(files)
    listing = "\n".join(bad)
    if bad:
        print(listing)
    assert not bad, f"modules in {' and '.join(SIZE_CHECKED)} longer than {MAX_LINES} lines:\n{listing}"


def _sections(doc: str) -> dict[str, str]:
    """Heading (lower case) -> its text, for every `## ` section."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", doc, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        out[head.strip().lower()] = body
    return out


def _mentions(text: str, path: str) -> bool:
    return re.search(r"(?<![\w/.-])" + re.escape(path) + r"(?![\w])", text) is not None


def undocumented(doc: str, repo: Path = REPO) -> list[str]:
    """Modules of `DOCUMENTED` packages that `doc` does not name (see the module docstring)."""
    sections = _sections(doc)
    missing: list[str] = []
    for pkg, heading in DOCUMENTED.items():
        section = next((body for head, body in sections.items() if heading in head), "")
        for path in sorted((repo / pkg).rglob("*.py")):
            if path.name == "__init__.py" or _is_generated(path, repo):
                continue
            rel = path.relative_to(repo).as_posix()
            inner = path.relative_to(repo / pkg).as_posix()
            folder = path.parent.name + "/"
            if _mentions(doc, rel) or _mentions(section, inner):
                continue
            if path.parent != repo / pkg and any(
                    folder in line and _mentions(line, path.name) for line in section.splitlines()):
                continue
            missing.append(rel)
    return missing


def test_every_module_is_on_the_map() -> None:
    missing = undocumented(DOC.read_text(encoding="utf-8"))
    assert not missing, "docs/ARCHITECTURE.md does not name:\n" + "\n".join(missing)


# --- the checker itself --------------------------------------------------------------------------


def test_relative_and_lazy_imports_are_resolved(tmp_path: Path):
    pkg = tmp_path / "router" / "api"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import views\n")
    mod = pkg / "views.py"
    mod.write_text(
        "from __future__ import annotations\n"
        "import os.path\n"
        "from .. import engines_client\n"
        "from ..store import Store\n"
        "def f():\n"
        "    import torch.nn\n"
        "    from engines.batcher import Batcher\n"
    )
    assert [m for _, m in imported_modules(pkg / "__init__.py", tmp_path)] == ["router.api.views"]
    assert sorted(m for _, m in imported_modules(mod, tmp_path)) == [
        "__future__",
        "engines.batcher",
        "os.path",
        "router.engines_client",
        "router.store",
        "torch.nn",
    ]
    bad = layering_violations([pkg / "__init__.py", mod], tmp_path)["router"]
    assert bad == ["router/api/views.py:6 imports torch.nn", "router/api/views.py:7 imports engines.batcher"]
    contracts = tmp_path / "specroute" / "contracts"
    contracts.mkdir(parents=True)
    (contracts / "stats.py").write_text("import grpc\nimport numpy\n")
    assert layering_violations([contracts / "stats.py"], tmp_path)["specroute/contracts"] == [
        "specroute/contracts/stats.py:1 imports grpc"
    ]


def test_a_module_missing_from_the_map_fails(tmp_path: Path) -> None:
    for rel in ("router/api/new_thing.py", "router/gateway.py", "engines/worker/server.py", "bench/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    doc = ("## The gateway wing\n| `gateway.py` | hub |\n## The engine wing\n| `worker/` | `server.py` |\n"
           "## Data, tests and benchmarks\n`bench/x.py`\n")
    assert undocumented(doc, tmp_path) == ["router/api/new_thing.py"]
    assert undocumented(doc + "## The gateway wing, again\n`router/api/new_thing.py`", tmp_path) == []


def test_generated_stubs_are_skipped():
    assert _is_generated(REPO / "specroute" / "v1" / "engine_pb2_grpc.py")
    assert not _is_generated(REPO / "specroute" / "cli.py")
