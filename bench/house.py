"""The house's measurements (issue 44's goals): import circles among the package's modules
(imports inside functions included), private names imported from another module, files
over 600 lines, functions over 80 lines (not
counting their docstrings).

    python bench/house.py            # a report; exit 1 if any goal is missed
    python bench/house.py --json

An import of a module counts as an edge from the importing module to the imported one
(``from . import x`` to the package's ``x``; ``from .m import name`` to ``m``), except those
under ``if TYPE_CHECKING:``, which never run; a circle is a
strongly connected component of more than one module (networkx).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "offloadlab"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(module: str, is_package: bool, node: ast.AST, modules: set[str]) -> list[str]:
    """The package modules an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    found = []
    for alias in node.names:
        full = f"{prefix}.{alias.name}"
        found.append(full if full in modules else prefix)
    return [m for m in found if m in modules]


def docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's docstring (not counted in its length)."""
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def measure() -> dict:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(f): f for f in files}
    graph = nx.DiGraph()
    long_files, long_functions, private = [], [], []
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        graph.add_node(name)
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            long_files.append({"file": str(path.relative_to(ROOT)), "lines": lines})
        for node in ast.walk(tree):              # type-only imports: no runtime edge
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith(PACKAGE)):
                private.extend(f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                               for a in node.names if a.name.startswith("_")
                               and not a.name.startswith("__"))
            for target in imported(name, path.name == "__init__.py", node, set(modules)):
                if target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1 - docstring(node)
                if length > MAX_FUNCTION_LINES:
                    long_functions.append({"function": f"{path.relative_to(ROOT)}:"
                                                       f"{node.lineno} {node.name}",
                                           "lines": length})
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    return {"modules": len(modules), "circles": sorted(circles), "private_imports": private,
            "files_over": sorted(long_files, key=lambda r: -r["lines"]),
            "functions_over": sorted(long_functions, key=lambda r: -r["lines"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = measure()
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        print(f"{found['modules']} modules")
        print(f"import circles: {len(found['circles'])}")
        for circle in found["circles"]:
            print("  " + " <-> ".join(circle))
        print(f"private names imported from another module: {len(found['private_imports'])}")
        for where in found["private_imports"]:
            print(f"  {where}")
        print(f"files over {MAX_FILE_LINES} lines: {len(found['files_over'])}")
        for row in found["files_over"]:
            print(f"  {row['file']}: {row['lines']}")
        print(f"functions over {MAX_FUNCTION_LINES} lines: {len(found['functions_over'])}")
        for row in found["functions_over"]:
            print(f"  {row['function']}: {row['lines']}")
    missed = found["circles"] or found["private_imports"] or found["files_over"] \
        or found["functions_over"]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
