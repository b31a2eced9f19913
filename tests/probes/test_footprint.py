"""The BPF compile's code does not stay in the daemon's memory: once every family
is built, the compiler libraries' code (libLLVM's and libclang's executable
mappings, 72 MiB resident right after a compile) is no longer resident in this
process, as /proc/self/smaps shows, even while another BCC user (a concurrent
test's daemon) maps the same pages; and the programs still attach and run."""
from slotune.collectors.kernel.families import make_families
from slotune.collectors.kernel.program import COMPILER_LIBRARIES, Program

MIB = 2**20


def compiler_resident() -> int:
    """Bytes of the compiler libraries' code resident in this process (their read-only
    data, written once by the loader's relocations, is private memory now and stays:
    ~9 MiB)."""
    total, counting = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                counting = (len(fields) >= 6 and "x" in fields[1]
                            and any(lib in fields[5] for lib in COMPILER_LIBRARIES))
            elif counting and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_compiler_code_is_dropped_after_the_build(root_only):
    program = Program(make_families())
    try:
        resident = compiler_resident()
        print(f"compiler code resident after the build: {resident / MIB:.1f} MiB")
        assert resident < 4 * MIB          # 72 MiB before it was dropped (libLLVM 47, libclang 25)
        program.attach_tracepoints()
        assert all(program.attached.values()), program.errors
        assert program.prog_ids()
    finally:
        program.close()
