"""Reading a file a user named on the command line (or in a config) without trusting it.

Every file flag of every gputopo command (`--topology`, `--config`, `--cluster`, `--trace`,
`--kubeconfig`, `--health-file`, topology paths inside a cluster snapshot) reads through
`read_bytes` / `read_text`, so each one refuses the same things the same way:

* not a regular file: a FIFO would block `open()` until a writer comes (the command hangs), a
  character device such as `/dev/zero` never ends (the read runs out of memory), a directory
  cannot be parsed. The file is opened with O_NONBLOCK (a FIFO opens at once instead of
  waiting) and its type is checked with `fstat` on the open descriptor, so what is checked is
  what is read (no window between a `stat` of the name and the `open`).
* larger than the caller's cap: checked on the size `fstat` reports, and again while reading
  (a file that grows while it is read still stops at cap + 1 bytes), so memory is bounded.

The message of `UserFileError` names the path and the reason in one line; callers wrap it in
their own error type (TopologyError, ClusterError, ConfigError, ...) and their entry points
print it and exit 2. No I/O beyond the one read; no logging (the core never logs).
"""

from __future__ import annotations

import os
import stat

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
_CHUNK = 1 * MIB

# Caps per kind of file, each far above any real one (docs/operator.md "File flags"):
MAX_TOPOLOGY_BYTES = 1 * MIB  # a 16-GPU design.md §3 JSON or `topo -m` text is under 10 KiB
MAX_CONFIG_BYTES = 1 * MIB  # the plugin's YAML has 17 keys
MAX_HEALTH_FILE_BYTES = 1 * MIB  # one small entry per GPU
MAX_KUBECONFIG_BYTES = 16 * MIB  # embedded certificates, many contexts: ~100 KiB is large
MAX_CLUSTER_BYTES = 64 * MIB  # a 20,000-node snapshot is ~4 MiB
MAX_TRACE_BYTES = 1 * GIB  # streamed row by row, never held whole; full public traces are smaller


class UserFileError(ValueError):
    """A user-named file that cannot be read safely; the message says which and why."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(n: int) -> str:
    if n >= GIB and n % GIB == 0:
        return f"{n // GIB} GiB"
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} bytes"


def open_regular(path: str, max_bytes: int) -> int:
    """An open descriptor of the regular file `path` of at most `max_bytes` (by fstat).

    The caller owns the descriptor (close it, or wrap it with `os.fdopen`). For a file read as
    a stream (a trace); `read_bytes` also bounds a file that grows while it is read."""
    if not path:
        raise UserFileError("empty file name")
    if "\0" in path:
        raise UserFileError(f"{path!r}: file name contains a NUL character")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise UserFileError(f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise UserFileError(f"{path}: {st.st_size:,} bytes is larger than the {_size(max_bytes)} allowed")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str, max_bytes: int) -> bytes:
    """The whole content of the regular file `path`, at most `max_bytes` long.

    Raises UserFileError for anything else: missing, unreadable, not a regular file, too big."""
    fd = open_regular(path, max_bytes)
    try:
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise UserFileError(f"{path}: grew past the {_size(max_bytes)} allowed while being read")
        return b"".join(chunks)
    except OSError as e:
        raise UserFileError(f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_text(path: str, max_bytes: int, encoding: str = "utf-8") -> str:
    """`read_bytes` decoded; bad encoding is a UserFileError naming the byte offset.
    A leading byte order mark is dropped (editors on Windows write one)."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode(encoding).removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise UserFileError(f"{path}: not {encoding.upper()} text ({e.reason} at byte {e.start})") from None
    except LookupError:
        raise UserFileError(f"{path}: unknown encoding {encoding!r}") from None


def check_regular(path: str, max_bytes: int) -> None:
    """Refuse `path` as `open_regular` would, reading nothing: for a file a library opens
    itself by name (a kubeconfig, which the kubernetes client reads and may write back).
    Between this check and the library's own open the name could be replaced; a user-named
    file is the operator's, so that window is accepted (the check is against mistakes)."""
    os.close(open_regular(path, max_bytes))


def check_kubeconfig(value: str) -> None:
    """A `--kubeconfig` value: one path, or several joined by ':' as in $KUBECONFIG. Each part
    that exists must pass `check_regular`; a missing one is left to the kubernetes client,
    which merges what exists and reports "no configuration" in its own words."""
    for part in (p for p in value.split(os.pathsep) if p):
        if os.path.lexists(part):
            check_regular(part, MAX_KUBECONFIG_BYTES)
