"""Files for the routes that move them: folder listings (``/files/list``), tar archives out and in
(``/archive``), and the file errors answered as such (404, 403, 400)."""

from __future__ import annotations

import os
import stat
import tarfile
import time
from collections.abc import Iterator

from .protocol import ApiError

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from typing import BinaryIO

LISTING_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""A listing's ``modified``: the sandbox's local time, whole seconds, no zone (the published API's format)."""


def list_entry(entry: os.DirEntry[str]) -> dict[str, object] | None:
    """One listing row (None for an entry removed while we list); symlinks are followed, a
    broken one is a file of size 0 with the link's own time."""
    try:
        st, broken = entry.stat(), False
    except OSError:
        try:
            st, broken = entry.stat(follow_symlinks=False), True
        except OSError:  # removed while we were listing
            return None
    return {
        "name": entry.name,
        "type": "directory" if not broken and stat.S_ISDIR(st.st_mode) else "file",
        "size": 0 if broken else st.st_size,  # a folder's own size too (often 4096), as published
        "modified": time.strftime(LISTING_TIME_FORMAT, time.localtime(st.st_mtime)),
    }


def tar_members(path: str, arcname: str) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Tar headers of path and, for a folder, everything below it (no owner-name lookups)."""
    info = _tar_info(path, arcname)
    if info is None:
        return
    yield info, path
    if not info.isdir():
        return
    for name in sorted(os.listdir(path)):
        yield from tar_members(os.path.join(path, name), f"{arcname}/{name}")


def _tar_info(path: str, arcname: str) -> tarfile.TarInfo | None:
    st = os.lstat(path)
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid, info.mtime = st.st_uid, st.st_gid, int(st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    else:
        return None  # sockets, fifos and devices are skipped
    return info


def write_tar(path: str, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, source in tar_members(path, os.path.basename(path) or "root"):
            if info.isreg():
                with open(source, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def extract_tar(source: BinaryIO, dest: str) -> int:
    """Extract a tar into dest if every member is safe; return the number of members."""
    try:
        with tarfile.open(fileobj=source, mode="r:*") as tar:
            members = check_tar_members(tar, dest)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as exc:  # FilterError is raised as ApiError before extraction
        raise ApiError(400, f"the body is not a valid tar archive: {exc}") from None
    return len(members)


def check_tar_members(tar: tarfile.TarFile, dest: str) -> list[tarfile.TarInfo]:
    """Every member, after refusing absolute names and what the ``data`` filter refuses."""
    members = tar.getmembers()
    for member in members:
        if member.name.startswith("/"):
            raise ApiError(400, f"archive member {member.name!r} has an absolute path")
        try:
            tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise ApiError(400, f"archive member refused: {exc}") from None
    return members


def stat_or_404(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ApiError(404, f"no such file or directory: {path}") from None
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None


def open_or_error(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None
    except FileNotFoundError:
        raise ApiError(404, f"no such file or directory: {path}") from None


def make_dirs(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ApiError(400, f"not a directory: {path} (or one of its parents)") from None
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None
