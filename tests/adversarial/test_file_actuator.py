"""The file actuator on settings files as services really keep them: every JSON
kind beside the tuned numbers, an owner and mode of their own, a link, junk,
and a write that fails half way (a real file-size limit in a real process)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.file import FileActuator
from tests.conftest import ROOT

SERVICE_FILE = {"name": "svc", "rate_limit_rps": 100, "ratio": 0.5, "enabled": True, "debug": False,
                "tags": ["a", "b"], "limits": {"rps": 3, "burst": [1, 2]}, "none": None, "big": 10 ** 30,
                "label": "caf\u00e9", "max_batch_size": 8}


@pytest.fixture
def settings(tmp_path):
    path = tmp_path / "svc.json"
    path.write_text(json.dumps(SERVICE_FILE))
    return path


def test_a_push_changes_only_the_tuned_keys_and_keeps_every_other_value_and_the_order(settings):
    FileActuator(str(settings)).push({"rate_limit_rps": 90.0, "ratio": 0.75})
    after = json.loads(settings.read_text())
    assert after == {**SERVICE_FILE, "rate_limit_rps": 90, "ratio": 0.75}
    assert list(after) == list(SERVICE_FILE)
    assert after["enabled"] is True and type(after["rate_limit_rps"]) is int and type(after["ratio"]) is float


def test_current_reads_numbers_only_and_true_is_not_one(settings):
    assert FileActuator(str(settings)).current() == {"rate_limit_rps": 100.0, "ratio": 0.5, "big": 1e30,
                                                     "max_batch_size": 8.0}


def test_a_push_keeps_the_files_mode_and_owner(settings, root_only):
    os.chown(settings, 65534, 65534)
    settings.chmod(0o640)
    FileActuator(str(settings)).push({"rate_limit_rps": 90.0})
    st = settings.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (65534, 65534, 0o640)


def test_a_new_file_is_readable_by_the_service(tmp_path):
    path = tmp_path / "new.json"
    FileActuator(str(path)).push({"rate_limit_rps": 90.0})
    assert json.loads(path.read_text()) == {"rate_limit_rps": 90} and path.stat().st_mode & 0o777 == 0o644


def run_push(script: str, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch the system calls")
def test_a_push_of_several_settings_is_one_rename_with_file_and_folder_fsynced(settings, tmp_path):
    trace = tmp_path / "trace"
    result = run_push(f"""
        from slotune.actuators.file import FileActuator
        FileActuator({str(settings)!r}).push({{"rate_limit_rps": 90.0, "ratio": 0.75, "max_batch_size": 4.0}})
    """, "strace", "-f", "-e", "trace=openat,openat2,fsync,rename,renameat,renameat2", "-o", str(trace))
    assert result.returncode == 0, result.stderr
    calls = trace.read_text()
    # the folder, opened once with no link on its path (openat2, or the walk's last step where it lacks)
    folder = re.search(rf'openat2?\((?:AT_FDCWD, "{tmp_path}"|\d+, "{tmp_path.name}"), [^)]*O_DIRECTORY[^)]*\) = (\d+)',
                       calls)
    assert folder, calls
    fd = folder.group(1)
    after = calls.split(folder.group(0))[1]
    temp = re.search(rf'openat\({fd}, "(\.svc\.json\.\w+)", O_WRONLY\|O_CREAT\|O_EXCL', after)
    renames = re.findall(r"rename\w*\((.*)\)\s+= 0", after)
    assert temp and renames == [f'{fd}, "{temp.group(1)}", {fd}, "svc.json"']   # made and renamed inside the folder
    assert re.search(rf"fsync\({fd}\)\s+= 0", after.split("rename")[1])        # the folder after the rename
    assert after.split("rename")[0].count("fsync(") >= 1        # the new file is on disk before it replaces the old
    assert json.loads(settings.read_text())["max_batch_size"] == 4


def test_a_write_that_fails_half_way_changes_nothing_and_leaves_no_temp_file(settings, tmp_path):
    settings.write_text(json.dumps({**SERVICE_FILE, "notes": "x" * 20000}))
    before = settings.read_bytes()
    result = run_push(f"""
        import resource, signal, sys
        from slotune.actuators import ActuatorError
        from slotune.actuators.file import FileActuator
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))   # files end at 4 KiB: the write fails
        try:
            FileActuator({str(settings)!r}).push({{"rate_limit_rps": 90.0, "ratio": 0.75}})
        except ActuatorError as exc:
            sys.exit(f"refused: {{exc}}")
    """)
    assert result.returncode == 1 and "refused: cannot write" in result.stderr and "too large" in result.stderr
    assert settings.read_bytes() == before
    assert os.listdir(tmp_path) == [settings.name]


def test_a_symlink_is_refused_and_its_target_untouched(settings, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(settings)
    before = settings.read_bytes()
    with pytest.raises(ActuatorError, match="symbolic link"):
        FileActuator(str(link)).push({"rate_limit_rps": 90.0})
    assert settings.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("contents, words", [
    ("[1, 2]", "got a list"),
    ('"rate"', "got a string"),
    ("{not json", "is not JSON"),
    ('{"rate_limit_rps": NaN}', "'rate_limit_rps' is not a finite number"),
    ('{"rate_limit_rps": 1e400}', "'rate_limit_rps' is not a finite number"),
], ids=["a-list", "a-string", "not-json", "NaN", "1e400"])
def test_a_file_that_is_not_an_object_of_finite_numbers_is_refused_and_kept(tmp_path, contents, words):
    path = tmp_path / "svc.json"
    path.write_text(contents)
    actuator = FileActuator(str(path))
    for call in (actuator.current, lambda: actuator.push({"rate_limit_rps": 90.0})):
        with pytest.raises(ActuatorError) as err:
            call()
        assert str(path) in str(err.value) and words in str(err.value)
    assert path.read_text() == contents


def test_a_file_over_one_mib_is_refused(tmp_path):
    path = tmp_path / "svc.json"
    path.write_text(json.dumps({"notes": "x" * (2 << 20)}))
    with pytest.raises(ActuatorError, match="larger than 1048576 bytes"):
        FileActuator(str(path)).current()
