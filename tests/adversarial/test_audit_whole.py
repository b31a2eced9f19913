"""Audit lines are written whole or not at all: a decision's write cut short by a
full disk (a real 2 MiB tmpfs: ENOSPC) or by a file-size limit (RLIMIT_FSIZE in a
process of its own: EFBIG) leaves the audit file exactly as it was, raises
AuditError, and the next write, once there is room, adds whole lines only."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from slotune.store.audit import AuditError, AuditLog, Entry, Outcome
from tests.adversarial.test_store import fill, small_disk  # noqa: F401 (a fixture)
from tests.conftest import ROOT

LONG_REASON = "p99 above the SLO " * 600      # one decision of about 12 KiB: it crosses a page and the limit


def entries(reason: str = "p99 above the SLO") -> list[Entry]:
    return [Entry(1.0, "api", "throttle", setting, 100.0, 90.0, reason, Outcome.PUSHED, decision="1.1")
            for setting in ("rate_limit_rps", "concurrency_limit")]


def parsed(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_full_disk_leaves_the_audit_file_as_it_was(small_disk, root_only):  # noqa: F811
    audit = AuditLog(small_disk / "audit.jsonl")
    try:
        audit.write_all(entries())            # a first decision: its page has room left after it
        before = (small_disk / "audit.jsonl").read_bytes()
        fill(small_disk / "filler")
        with pytest.raises(AuditError, match="audit.jsonl cannot be written"):
            audit.write_all(entries(LONG_REASON))     # fits the page's rest in part, then ENOSPC
        assert (small_disk / "audit.jsonl").read_bytes() == before
        (small_disk / "filler").unlink()
        audit.write_all(entries("room again"))
        reasons = [e["reason"] for e in parsed(small_disk / "audit.jsonl")]
        assert reasons == ["p99 above the SLO"] * 2 + ["room again"] * 2
    finally:
        audit.close()


def test_a_file_size_limit_leaves_the_audit_file_as_it_was(tmp_path):
    path = tmp_path / "audit.jsonl"
    script = textwrap.dedent(f"""
        import os, resource, signal
        from slotune.store.audit import AuditError, AuditLog
        from tests.adversarial.test_audit_whole import LONG_REASON, entries
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        audit = AuditLog({str(path)!r})
        audit.write_all(entries())
        print(os.path.getsize({str(path)!r}), flush=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize({str(path)!r}) + 100, hard))
        try:
            audit.write_all(entries(LONG_REASON))      # 100 bytes fit, then EFBIG
        except AuditError as exc:
            print("refused:", exc, flush=True)
        print(os.path.getsize({str(path)!r}), flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        audit.write_all(entries("room again"))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    size_before, refusal, size_after = result.stdout.splitlines()
    assert refusal.startswith("refused: audit log") and "short write" in refusal
    assert size_after == size_before
    assert [e["reason"] for e in parsed(path)] == ["p99 above the SLO"] * 2 + ["room again"] * 2
