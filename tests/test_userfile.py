"""gputopo.userfile: the one reader of user-named files refuses what is not a regular file and
what is too big, without blocking and without reading more than the cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.userfile import (
    UserFileError,
    check_kubeconfig,
    check_regular,
    open_regular,
    read_bytes,
    read_text,
)


def test_reads_a_regular_file_up_to_the_cap(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_bytes(b"x" * 100)
    assert read_bytes(str(f), 100) == b"x" * 100  # exactly at the cap is fine
    with pytest.raises(UserFileError, match="100 bytes is larger than the 99 bytes allowed"):
        read_bytes(str(f), 99)


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for call in (read_bytes, check_regular, open_regular):
        with pytest.raises(UserFileError, match="is a FIFO, not a regular file"):
            call(str(fifo), 1024)


def test_devices_directories_and_sockets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserFileError, match="is a character device"):
        read_bytes("/dev/zero", 1024)
    with pytest.raises(UserFileError, match="is a directory"):
        read_bytes(str(tmp_path), 1024)
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(UserFileError, match="No such device or address"):  # open() refuses it
            read_bytes(str(path), 1024)


def test_a_symlink_to_a_device_is_judged_by_its_target(tmp_path: Path) -> None:
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(UserFileError, match="character device"):
        read_text(str(link), 1024)


def test_missing_empty_name_nul_and_bad_text(tmp_path: Path) -> None:
    with pytest.raises(UserFileError, match="No such file"):
        read_bytes(str(tmp_path / "nope"), 10)
    with pytest.raises(UserFileError, match="empty file name"):
        read_bytes("", 10)
    with pytest.raises(UserFileError, match="NUL"):
        read_bytes("a\0b", 10)
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"caf\xe9")
    with pytest.raises(UserFileError, match=r"not UTF-8 text .* at byte 3"):
        read_text(str(f), 10)
    f.write_bytes("\ufeffhello".encode())
    assert read_text(str(f), 100) == "hello"


def test_a_sparse_huge_file_is_refused_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "huge"
    with open(f, "wb") as fh:
        fh.truncate(1 << 40)  # 1 TiB, sparse: reading it would take hours and all memory
    with pytest.raises(UserFileError, match="larger than the 1 MiB allowed"):
        read_bytes(str(f), 1 << 20)


def test_kubeconfig_lists_check_the_files_that_exist(tmp_path: Path) -> None:
    good = tmp_path / "config"
    good.write_text("apiVersion: v1\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_kubeconfig(str(good))
    check_kubeconfig(f"{good}{os.pathsep}{tmp_path / 'absent'}")  # absent parts are the client's call
    check_kubeconfig(str(tmp_path / "absent"))  # missing: the client says so in its own words
    with pytest.raises(UserFileError, match="FIFO"):
        check_kubeconfig(f"{good}{os.pathsep}{fifo}")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=5000), cap=st.integers(0, 6000))
def test_content_comes_back_exactly_or_is_refused_as_too_big(tmp_path: Path, data: bytes, cap: int) -> None:
    f = tmp_path / "f"
    f.write_bytes(data)
    if len(data) <= cap:
        assert read_bytes(str(f), cap) == data
    else:
        with pytest.raises(UserFileError, match="larger than"):
            read_bytes(str(f), cap)


@settings(max_examples=200)
@given(name=st.text(max_size=40))
def test_any_name_is_content_or_a_user_file_error(name: str) -> None:
    """Total: whatever the user typed, the answer is bytes or UserFileError, never another
    exception (a NUL, an empty name, a directory, a name too long for the OS)."""
    try:
        out = read_bytes(name, 1 << 16)
    except UserFileError:
        return
    assert isinstance(out, bytes)
