"""A probe family is its C and its module, nothing else: in a copy of the tree, a
toy family added as bpf/toy.bpf.c and daemon/collectors/kernel/families/toy.py
alone is found, hooks the exec program beside the exec family's own hook, and
compiles, loads and attaches with it; and `git status` names only the two files."""

from tests.conftest import changed, copy_of_the_tree, run_in

TOY_C = """/* Toy family: the execs of watched tasks again, a second hook on sched_process_exec. */

static __always_inline void toy_exec(u32 old_pid)
{
    u32 *service = service_of_task(old_pid);
    if (service)
        count_add(*service, SIG_TOY_EXECS, 0, 1);
}
"""

TOY_PY = '''"""Toy family (bpf/toy.bpf.c)."""
from slotune.collectors.kernel.arrivals import EXEC
from slotune.collectors.kernel.family import Family, Signal


class Toy(Family):
    name = source = "toy"
    signals = (Signal("toy_execs", "slotune_toy_execs_total", None, "counter", "Execs, counted by the toy"),)
    raw_tracepoints = (EXEC,)
    hooks = (("process_exec", "toy_exec"),)
'''

RUN = """
from slotune.collectors.kernel.families import FAMILIES, make_families
from slotune.collectors.kernel.program import Program
program = Program(make_families(["toy", "exec"]))
try:
    program.attach_tracepoints()
    print(sorted(FAMILIES), [f.name for f in program.families], program.off)
    print(sorted(probe for probe, on in program.attached.items() if on))
    i = program.text.index("hook_process_exec(u32 old_pid)\\n{")
    print(program.text[i:program.text.index("}", i)].split())
finally:
    program.close()
"""


def test_a_toy_family_added_as_two_files_builds_beside_the_others(root_only, tmp_path):
    tree = copy_of_the_tree(tmp_path)
    (tree / "bpf" / "toy.bpf.c").write_text(TOY_C)
    (tree / "daemon" / "collectors" / "kernel" / "families" / "toy.py").write_text(TOY_PY)
    found, attached, dispatcher = run_in(tree, RUN)
    assert found == "['exec', 'http', 'offcpu', 'redis', 'runqueue', 'tcp', 'tls', 'toy'] ['exec', 'toy'] {}"
    assert "'sched:sched_process_exec'" in attached
    assert dispatcher.endswith("'exec_count(old_pid);', 'toy_exec(old_pid);']")
    assert changed(tree) == "?? bpf/toy.bpf.c\n?? daemon/collectors/kernel/families/toy.py\n"
