"""Which file a socket path names now, for both plugin modes.

kubelet owns the folders our sockets live in: when it restarts it deletes every socket there and
creates its own again. A path alone cannot tell "still ours" from "replaced since", so the
device-plugin mode's server and kubelet watcher and the DRA mode's registrar compare a file's
identity (device, inode, ctime) instead.
"""

from __future__ import annotations

import os

FileId = tuple[int, int, int]  # (device, inode, ctime ns): a file replaced under the same name differs


def file_id(path: str) -> FileId | None:
    """The identity of the file at `path`, None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
