"""The import graph of the biencoder package, measured from the source (nothing is imported or run).

    python scripts/import_graph.py            # Markdown: one row per module, then the circles
    python scripts/import_graph.py --json     # the same as one JSON object

Per module: its line count, the biencoder modules it imports at import time (module or class body, under ``if`` or
``try`` too) and those it imports only inside functions (run when the function runs: the way a circle is hidden),
and whether importing it imports Hydra (its own top-level imports, or those of any biencoder module it imports at
import time). Circles are the strongly connected components of the graph: over top-level imports only, and over
every import; a circle in the second list but not the first is one that function-local imports hide. Last, the
functions (and methods) longer than 50 lines, and those with more than 6 parameters.
``docs/architecture.md`` quotes this output. The import rules themselves are import-linter contracts
(``[tool.importlinter]`` in ``pyproject.toml``, run by ``tests/project/test_import_graph.py``); this graph adds what
they cannot say: which imports run only inside functions, and the sizes.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGE = "biencoder"
#: the limits docs/architecture.md states and this output measures
MODULE_LINES, FUNCTION_LINES, PARAMETERS, LINE_LENGTH = 350, 50, 6, 119
SRC = Path(__file__).resolve().parents[1]


@dataclass
class Module:
    """One module of the package: ``name`` (``biencoder.x`` or ``biencoder.report.y``), ``lines``, and the
    biencoder modules it imports at import time (``top``) and only inside functions (``local``), sorted; ``hydra``:
    whether its own top-level imports include Hydra."""

    name: str
    lines: int
    top: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)
    hydra: bool = False


def module_name(path: Path, src: Path) -> str:
    """``src/biencoder/report/runs.py`` → ``biencoder.report.runs``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules an import statement loads (absolute names), for ``import a.b`` and ``from .x import y`` alike;
    ``from . import x`` names the module ``x`` when it is one, else the package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    out = []
    for alias in node.names:
        full = f"{stem}.{alias.name}"
        out.append(full if full in known else stem)
    return out


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time (not inside a function)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, not in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def import_graph(src: Path = SRC) -> dict[str, Module]:
    """Every ``.py`` under ``src`` (the package folder) as a :class:`Module`, keyed by its dotted name."""
    files = sorted(p for p in Path(src).rglob("*.py") if "__pycache__" not in p.parts)
    known = {module_name(p, src) for p in files}
    graph = {}
    for path in files:
        name = module_name(path, src)
        text = path.read_text(encoding="utf-8")
        module = Module(name, len(text.splitlines()))
        top, local = set(), set()
        for node, at_import in _imports(ast.parse(text)):
            for target in _targets(node, name, path.name == "__init__.py", known):
                if target.split(".")[0] == "hydra" and at_import:
                    module.hydra = True
                # the package itself (from . import x with x not a module) counts only when it has code of its own
                inner = next((m for m in (target, target.rsplit(".", 1)[0]) if m in known), None)
                if inner is not None and inner != name:
                    (top if at_import else local).add(inner)
        module.top, module.local = sorted(top), sorted(local - top)
        graph[name] = module
    return graph


def imports_hydra(graph: dict[str, Module]) -> dict[str, bool]:
    """Module → whether importing it imports Hydra (its own top-level imports, or those of any module it reaches
    through top-level imports)."""
    out = {}
    for name in graph:
        reached, todo = {name}, [name]
        while todo:
            for nxt in graph[todo.pop()].top:
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        out[name] = any(graph[m].hydra for m in reached)
    return out


def circles(graph: dict[str, Module], local: bool = False) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, over top-level imports or,
    with ``local``, over every import."""
    edges = {n: m.top + (m.local if local else []) for n, m in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(out)


def functions(src: Path = SRC) -> list[tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(module, qualified name, node) of every function and method under ``src``, nested ones included."""
    out = []
    for path in sorted(p for p in Path(src).rglob("*.py") if "__pycache__" not in p.parts):
        name = module_name(path, src)
        out += [(name, qualified, node) for qualified, node in _defined(ast.parse(path.read_text(encoding="utf-8")))]
    return out


def _defined(node: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of the functions defined in ``node``, in classes and functions too."""
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualified = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                out.append((qualified, child))
            out += _defined(child, qualified + ".")
    return out


def long_functions(src: Path = SRC, limit: int = 50) -> list[tuple[str, str, int]]:
    """(module, qualified name, lines) of every function or method longer than ``limit`` lines, longest first."""
    sized = [(module, name, node.end_lineno - node.lineno + 1) for module, name, node in functions(src)]
    return sorted((item for item in sized if item[2] > limit), key=lambda item: -item[2])


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The named parameters of a function (positional-only, positional, keyword-only), without a method's leading
    ``self`` or ``cls``; ``*args`` and ``**kwargs`` are not counted."""
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def wide_functions(src: Path = SRC, limit: int = 6) -> list[tuple[str, str, int]]:
    """(module, qualified name, parameters) of every function or method with more than ``limit`` parameters
    (:func:`parameter_count`), widest first."""
    counted = [(module, name, parameter_count(node)) for module, name, node in functions(src)]
    return sorted((item for item in counted if item[2] > limit), key=lambda item: -item[2])


def markdown(graph: dict[str, Module], src: Path = SRC) -> str:
    """The table docs/architecture.md quotes: module, lines, imports at import time, imports in functions only,
    Hydra on import; then the circles."""

    def short(name: str) -> str:
        return name[len(PACKAGE) + 1 :] or PACKAGE

    hydra = imports_hydra(graph)
    lines = [
        "| module | lines | imports (top level) | imports (in functions only) | imports Hydra |",
        "|---|---|---|---|---|",
    ]
    for name, m in sorted(graph.items()):
        lines.append(
            f"| {short(name)} | {m.lines} | {', '.join(map(short, m.top)) or '–'} | "
            f"{', '.join(map(short, m.local)) or '–'} | {'yes' if hydra[name] else 'no'} |"
        )
    total = sum(m.lines for m in graph.values())
    lines.append(f"\n{len(graph)} modules, {total} lines.")
    for title, found in (
        ("Circles over top-level imports", circles(graph)),
        ("Circles over every import (function-local ones included)", circles(graph, local=True)),
    ):
        shown = "; ".join(" ↔ ".join(map(short, c)) for c in found) or "none"
        lines.append(f"{title}: {shown}.")
    return "\n".join(lines + limits(graph, src))


def limits(graph: dict[str, Module], src: Path = SRC) -> list[str]:
    """The sizes docs/architecture.md states limits for: the largest module, function and signature, each with
    those over the limit, and the lines over :data:`LINE_LENGTH` characters per tree."""

    def short(name: str) -> str:
        return name[len(PACKAGE) + 1 :] or PACKAGE

    def listed(items) -> str:
        return "; ".join(f"{short(m)}{'.' + f if f else ''} {n}" for m, f, n in items) or "none"

    sizes = sorted(((m.name, "", m.lines) for m in graph.values()), key=lambda item: -item[2])
    sized, counted = long_functions(src, limit=0), wide_functions(src, limit=-1)
    over = long_lines(src)
    return [
        f"Largest module: {listed(sizes[:1])} lines; over {MODULE_LINES}: "
        f"{listed(i for i in sizes if i[2] > MODULE_LINES)}.",
        f"Largest function: {listed(sized[:1])} lines; over {FUNCTION_LINES}: "
        f"{listed(i for i in sized if i[2] > FUNCTION_LINES)}.",
        f"Widest signature: {listed(counted[:1])} parameters; over {PARAMETERS}: "
        f"{listed(i for i in counted if i[2] > PARAMETERS)}.",
        f"Lines over {LINE_LENGTH} characters: " + ", ".join(f"{name} {n}" for name, n in over.items()) + ".",
    ]


def long_lines(src: Path = SRC, limit: int = LINE_LENGTH) -> dict[str, int]:
    """Lines longer than ``limit`` characters per tree: the package's ``.py`` files and, in a checkout, those of the
    repository's ``tests/`` and ``scripts/`` (``{"src": 0, "tests": 0, "scripts": 0}``)."""
    trees = {"src": Path(src)}
    repo = Path(src).resolve().parents[1]
    trees.update({name: repo / name for name in ("tests", "scripts") if (repo / name).is_dir()})
    return {
        name: sum(
            len(line) > limit
            for path in tree.rglob("*.py")
            if "__pycache__" not in path.parts
            for line in path.read_text(encoding="utf-8").splitlines()
        )
        for name, tree in trees.items()
    }


BEGIN, END = "<!-- import_graph.py: begin -->", "<!-- import_graph.py: end -->"


def write_between_markers(path: Path, table: str) -> None:
    """Put ``table`` between the :data:`BEGIN` and :data:`END` markers of ``path`` (docs/architecture.md)."""
    text = path.read_text(encoding="utf-8")
    head, sep, rest = text.partition(BEGIN)
    _, sep_end, tail = rest.partition(END)
    if not (sep and sep_end):
        raise SystemExit(f"error: {path} has no '{BEGIN}' ... '{END}' markers: add them where the table goes")
    path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=SRC, help="the package folder (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of Markdown")
    parser.add_argument(
        "--write",
        type=Path,
        metavar="MD",
        help="replace the table between the import_graph.py markers of this Markdown file",
    )
    args = parser.parse_args(argv)
    graph = import_graph(args.src)
    if args.write:
        write_between_markers(args.write, markdown(graph, args.src))
        return 0
    if args.json:
        hydra = imports_hydra(graph)
        print(
            json.dumps(
                {
                    "modules": {n: {**asdict(m), "imports_hydra": hydra[n]} for n, m in graph.items()},
                    "circles_top_level": circles(graph),
                    "circles_all": circles(graph, local=True),
                    "long_functions": long_functions(args.src),
                    "wide_functions": wide_functions(args.src),
                    "long_lines": long_lines(args.src),
                },
                indent=2,
            )
        )
    else:
        print(markdown(graph, args.src))
    return 0
