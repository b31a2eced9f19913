"""The daemon's packages import one another without a cycle, and the daemon does
not import bench/ or tests/ (issue 39: config knew every subsystem, and a cycle
between config, control, collectors, export, store and profiles hid behind
function-level imports). Every import counts, at the top of a module or inside
a function."""
import ast
from collections import defaultdict

from tests.conftest import ROOT

DAEMON = ROOT / "daemon"


def _modules():
    """Every module under daemon/, by its dotted name."""
    mods = {}
    for path in DAEMON.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name, path, mods):
    """The names a module imports, anywhere in it; `from pkg import name` is
    pkg.name where that is a module, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in mods else base)
    return out


def _layer(module):
    """daemon.control.loop -> daemon.control; daemon.config -> daemon.config."""
    return ".".join(module.split(".")[:2])


def _graph():
    mods = _modules()
    edges = defaultdict(list)
    foreign = []
    for name, path in sorted(mods.items()):
        for dep in sorted(_imports(name, path, mods)):
            top = dep.split(".")[0]
            if top in ("bench", "tests"):
                foreign.append(f"{name} -> {dep}")
            if top != "daemon" or dep == "daemon":
                continue
            a, b = _layer(name), _layer(dep)
            if a != b:
                edges[(a, b)].append(f"{name} -> {dep}")
    return edges, foreign


def _cycle(edges):
    """One cycle among the layers, as a list of (a, b) edges, or []."""
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    state = {}
    path = []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(succ[node]):
            if state.get(nxt) == "open":
                ring = path[path.index(nxt):] + [nxt]
                return list(zip(ring, ring[1:]))
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = "done"
        return []

    for node in sorted(succ):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_daemon_packages_import_one_another_without_a_cycle():
    edges, _ = _graph()
    cycle = _cycle(edges)
    assert not cycle, "import cycle between the daemon's packages:\n" + "\n".join(
        f"  {a} -> {b}: e.g. {', '.join(edges[(a, b)][:3])}" for a, b in cycle)


def test_the_daemon_imports_neither_bench_nor_tests():
    _, foreign = _graph()
    assert not foreign, "the installed daemon must not need bench/ or tests/:\n  " + "\n  ".join(foreign)
