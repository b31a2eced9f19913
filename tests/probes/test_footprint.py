"""The BPF compile's code does not stay in the daemon's memory: once every family
is built, the compiler libraries' code (libLLVM's and libclang's executable
mappings, 72 MiB resident right after a compile) is paged out, as /proc/self/smaps
shows, and the programs still attach and run afterwards. Pages another process
maps too (another BCC user's, a concurrent test's daemon) are shared page cache
that the kernel leaves in place: the check counts the pages this process alone
holds, so it is strict only while no other BCC process runs."""
from daemon.collectors.kernel.families import make_families
from daemon.collectors.kernel.program import COMPILER_LIBRARIES, Program

MIB = 2**20


def compiler_resident() -> int:
    """Bytes of the compiler libraries' code resident in this process alone (their
    read-only data, written once by the loader's relocations, is private memory now:
    paging it out would need swap, so it stays, ~9 MiB)."""
    total, counting = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                counting = (len(fields) >= 6 and "x" in fields[1]
                            and any(lib in fields[5] for lib in COMPILER_LIBRARIES))
            elif counting and fields[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(fields[1]) * 1024
    return total


def test_compiler_code_is_paged_out_after_the_build(root_only):
    program = Program(make_families())
    try:
        resident = compiler_resident()
        print(f"compiler libraries resident after the build: {resident / MIB:.1f} MiB")
        assert resident < 4 * MIB          # 72 MiB before it was paged out (libLLVM 47, libclang 25)
        program.attach_tracepoints()
        assert all(program.attached.values()), program.errors
        assert program.prog_ids()
    finally:
        program.close()
