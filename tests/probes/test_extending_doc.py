"""docs/extending.md shows the exec family as it is: each file it quotes whole,
and what `slotune probes` prints for it."""
import re

from tests.conftest import ROOT, run_slotune

DOC = (ROOT / "docs" / "extending.md").read_text()
BLOCKS = re.findall(r"^```\w*\n(.*?)^```$", DOC, re.S | re.M)
QUOTED = ("bpf/exec.bpf.c", "daemon/collectors/kernel/families/exec.py",
          "tests/probes/test_exec.py", "tests/probes/workers/execer.py")


def test_every_file_it_quotes_is_the_repository_s():
    for path in QUOTED:
        assert (ROOT / path).read_text() in BLOCKS, f"{path} differs from its copy in docs/extending.md"


def test_what_slotune_probes_prints_is_what_it_shows():
    listing = run_slotune("probes", "--list", "--family", "exec").stdout
    assert f"$ slotune probes --list --family exec\n{listing}" in DOC
    generated = [line for line in run_slotune("probes", "--print", "--family", "exec").stdout.splitlines()
                 if "PROCESS_EXECS" in line]
    assert "\n".join(generated) + "\n$ bash" in DOC
