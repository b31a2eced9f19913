"""The daemon's packages import one another without a cycle, and the daemon does
not import bench/ or tests/ (issue 39: config knew every subsystem, and a cycle
between config, control, collectors, export, store and profiles hid behind
function-level imports). Every import counts, at the top of a module or inside
a function; only those under `if TYPE_CHECKING:` do not, as they never run (a tuner
names control's Inputs type for its signature)."""
import ast
from collections import defaultdict

from tests.conftest import ROOT, package_folders

# The folders the `slotune` import package is made of, by folder (setup.py).
PACKAGE = {folder: name for name, folder in package_folders().items()}


def _modules():
    """Every module of the slotune package, by its dotted name (daemon/config.py is
    slotune.config, tuners/throttle.py slotune.tuners.throttle)."""
    mods = {}
    for folder, name in PACKAGE.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([name, *parts])] = path
    return mods


def _imports(name, path, mods):
    """The names a module imports, anywhere in it; `from pkg import name` is
    pkg.name where that is a module, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []      # names for the type checker only: nothing is imported at run time
    for node in ast.walk(tree):
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
    """slotune.control.loop -> slotune.control; slotune.config -> slotune.config."""
    return ".".join(module.split(".")[:2])


def _graph():
    mods = _modules()
    edges = defaultdict(list)
    foreign = []
    for name, path in sorted(mods.items()):
        for dep in sorted(_imports(name, path, mods)):
            top = dep.split(".")[0]
            if top in ("bench", "tests", *PACKAGE):
                foreign.append(f"{name} -> {dep}")
            if top != "slotune" or dep == "slotune":
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
    assert not foreign, "the installed daemon needs neither bench/ nor tests/, and names its own modules " \
        "slotune.*, never by their folders (daemon, tuners, bpf):\n  " + "\n  ".join(foreign)


def test_the_checkout_imports_slotune_by_its_one_name():
    """From the checkout's root `import daemon` would also work and load a second copy of
    every module beside slotune's: bench/, tests/ and the stack use the one name."""
    old = []
    for folder in ("bench", "tests", "reference_stack", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for dep in _imports(path.stem, path, {}):
                if dep.split(".")[0] in PACKAGE:
                    old.append(f"{path.relative_to(ROOT)} -> {dep}")
    assert not old, "import slotune.*, not the folders:\n  " + "\n  ".join(old)
