"""The Python package's layering, counted from its imports (docs/architecture.md#the-python-package).

    python tools/layers.py            # circles, upward imports, function-level imports, long files, define's length
    python tools/layers.py --list     # and every upward and function-level import, file:line

A module's floor is 1 + the highest floor among the package modules it imports at
module level (floor 1 imports none of them). An import is *upward* when it runs
from a module to one on a higher floor (only an import inside a function can). A
circle is a set of modules that import each other in a loop, function-level
imports included. `if TYPE_CHECKING:` imports are not counted: they never run.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "python"
PACKAGE = "opforge"
LONG_FILE = 1000


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(current: str, is_package: bool, node: ast.ImportFrom | ast.Import, modules: set[str]) -> list[str]:
    """The package modules an import statement names."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    if node.level:
        base = current if is_package else current.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in modules:
            out.append(full)
        elif base in modules:
            out.append(base)
    return out


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(tree: ast.Module):
    """(node, inside_function) for each import that runs."""
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child.test):
                for c in child.orelse:
                    visit_one(c, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child, in_function):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child, in_function))
        visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def graph():
    files = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    modules = set(files)
    top: dict[str, set[str]] = {m: set() for m in modules}
    edges: list[tuple[str, str, int, bool]] = []  # (from, to, line, inside a function)
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, in_function in imports_of(tree):
            for target in resolve(mod, path.name == "__init__.py", node, modules):
                if target == mod or mod.startswith(target + "."):
                    continue  # a package's own __init__ runs first in any case
                edge = (mod, target, node.lineno, in_function)
                if edge not in edges:  # `from . import a, b` of one module counts once
                    edges.append(edge)
                if not in_function:
                    top[mod].add(target)
    return files, top, edges


def floors(top: dict[str, set[str]]) -> dict[str, int]:
    floor: dict[str, int] = {}

    def of(m: str, stack: tuple = ()) -> int:
        if m in floor:
            return floor[m]
        if m in stack:  # a module-level circle: counted as a circle, floors cut there
            return 0
        floor[m] = 1 + max((of(t, stack + (m,)) for t in top[m]), default=0)
        return floor[m]

    for m in top:
        of(m)
    return floor


def circles(edges) -> list[list[str]]:
    adj: dict[str, set[str]] = {}
    for a, b, _line, _f in edges:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set())
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(adj):
        if v not in index:
            strong(v)
    return out


def function_length(path: Path, name: str) -> int:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    return -1


def main(argv: list[str]) -> int:
    files, top, edges = graph()
    floor = floors(top)
    upward = [e for e in edges if floor[e[1]] > floor[e[0]]]
    inside = [e for e in edges if e[3]]
    loops = circles(edges)
    long_files = sorted((len(p.read_text().splitlines()), m) for m, p in files.items())
    print(f"modules: {len(files)}, floors: {max(floor.values())}")
    print(f"circles: {len(loops)}" + "".join(f"\n  {' <-> '.join(c)}" for c in loops))
    print(f"upward imports: {len(upward)}")
    print(f"imports inside functions: {len(inside)}")
    over = [(n, m) for n, m in long_files if n > LONG_FILE]
    print(f"files over {LONG_FILE} lines: {len(over)}" + "".join(f"\n  {m}: {n}" for n, m in over))
    print(f"longest: " + ", ".join(f"{m} {n}" for n, m in long_files[-3:][::-1]))
    print(f"define: {function_length(files['opforge._op'], 'define')} lines")
    if "--list" in argv:
        for title, rows in (("upward", upward), ("inside functions", inside)):
            print(f"\n{title}:")
            for a, b, line, _f in sorted(rows):
                print(f"  {files[a].relative_to(ROOT.parent)}:{line}  {a} (floor {floor[a]}) -> {b} (floor {floor[b]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
