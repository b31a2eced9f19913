"""A service's user who owns a folder on the way to a file slotune reads or writes
as root: a folder link in the middle of the path, and a folder swapped for a link
between the check and the write. Each is refused or lands in the folder checked;
nothing is read or written through the link. Both ways of resolving a path run:
openat2 (RESOLVE_NO_SYMLINKS) and the walk used where the kernel lacks it."""
from __future__ import annotations

import json
import os

import pytest

from slotune.actuators import ActuatorError, file as file_actuator
from slotune.actuators.file import FileActuator
from slotune.host import safe_files

OTHERS = {"rate_limit_rps": 100}


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    if request.param == "walk":
        monkeypatch.setattr(safe_files, "OPENAT2", None)
    elif safe_files.OPENAT2 is None:
        pytest.skip("openat2 is not used on this machine")
    return request.param


@pytest.fixture
def other_service(tmp_path):
    """Another service's folder and settings file, and the files in it."""
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "svc.json").write_text(json.dumps(OTHERS))
    (folder / "admin.token").write_text("other-secret\n")
    (folder / "admin.token").chmod(0o600)
    (folder / "svc.pid").write_text(f"{os.getpid()}\n")
    return folder


def untouched(folder) -> bool:
    return (sorted(os.listdir(folder)) == ["admin.token", "svc.json", "svc.pid"]
            and json.loads((folder / "svc.json").read_text()) == OTHERS)


def test_a_folder_link_in_the_middle_of_a_settings_path_is_refused(resolver, tmp_path, other_service):
    (tmp_path / "mine").symlink_to(other_service)
    actuator = FileActuator(str(tmp_path / "mine" / "svc.json"))
    for call in (actuator.current, lambda: actuator.push({"rate_limit_rps": 1.0})):
        with pytest.raises(ActuatorError) as err:
            call()
        assert f"{tmp_path}/mine is a symbolic link" in str(err.value)
        assert f"name the real path, {other_service}/svc.json" in str(err.value)
    assert untouched(other_service)


def test_a_new_file_through_a_folder_link_is_not_made(resolver, tmp_path, other_service):
    (tmp_path / "mine").symlink_to(other_service)
    with pytest.raises(ActuatorError, match="symbolic link"):
        FileActuator(str(tmp_path / "mine" / "new.json")).push({"rate_limit_rps": 1.0})
    assert untouched(other_service)


def test_token_and_pid_files_behind_a_folder_link_are_refused(resolver, tmp_path, other_service):
    (tmp_path / "mine").symlink_to(other_service)
    with pytest.raises(ActuatorError, match="symbolic link") as err:
        safe_files.read_token(str(tmp_path / "mine" / "admin.token"))
    assert "other-secret" not in str(err.value)
    settings = tmp_path / "svc.json"
    settings.write_text("{}")
    actuator = FileActuator(str(settings), pid_file=str(tmp_path / "mine" / "svc.pid"), signal="SIGHUP",
                            owns=lambda pid: True)
    with pytest.raises(ActuatorError, match="symbolic link"):
        actuator.push({"rate_limit_rps": 1.0})
    assert settings.read_text() == "{}"


def test_a_link_higher_up_is_refused_too(resolver, tmp_path, other_service):
    (tmp_path / "deep").symlink_to(tmp_path)
    with pytest.raises(ActuatorError, match=f"{tmp_path}/deep is a symbolic link"):
        FileActuator(str(tmp_path / "deep" / "other" / "svc.json")).current()


def swap_for_link(folder, target):
    """What a service's user who owns folder's parent can do at any moment."""
    os.rename(folder, f"{folder}.moved")
    os.symlink(target, folder)


def test_a_folder_swapped_for_a_link_after_the_read_is_refused_at_the_write(resolver, tmp_path, other_service,
                                                                            monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "svc.json").write_text(json.dumps(OTHERS))
    real_read = file_actuator.read_regular

    def read_then_swap(*args):
        got = real_read(*args)
        swap_for_link(mine, other_service)
        return got
    monkeypatch.setattr(file_actuator, "read_regular", read_then_swap)
    with pytest.raises(ActuatorError, match=f"{mine} is a symbolic link"):
        FileActuator(str(mine / "svc.json")).push({"rate_limit_rps": 1.0})
    assert untouched(other_service)


def test_a_folder_swapped_between_the_temporary_file_and_the_rename_cannot_redirect_it(resolver, tmp_path,
                                                                                       other_service, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "svc.json").write_text(json.dumps(OTHERS))
    real_fsync, swaps = os.fsync, []

    def fsync_then_swap(fd):     # the temporary file's fsync, just before the rename
        real_fsync(fd)
        if not swaps:
            swaps.append(fd)
            swap_for_link(mine, other_service)
    monkeypatch.setattr(os, "fsync", fsync_then_swap)
    FileActuator(str(mine / "svc.json")).push({"rate_limit_rps": 1.0})
    assert swaps and untouched(other_service)
    moved = tmp_path / "mine.moved"                   # the folder checked, wherever it went
    assert os.listdir(moved) == ["svc.json"] and json.loads((moved / "svc.json").read_text()) == {"rate_limit_rps": 1}


def test_a_file_set_aside_twice_in_one_second_keeps_both(tmp_path):
    state = tmp_path / "state.json"
    asides = []
    for body in ("first", "second"):
        state.write_text(body)
        (tmp_path / "state.json-wal").write_text(body + " wal")
        asides.append(safe_files.set_aside(state, companions=("-wal",)))
    assert asides[0] != asides[1] and not state.exists()
    assert [open(a).read() for a in asides] == ["first", "second"]
    assert [open(a + "-wal").read() for a in asides] == ["first wal", "second wal"]
