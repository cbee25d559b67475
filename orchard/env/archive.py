"""Extracting an archive that came from a sandbox: only files and folders, only inside the target.

The tar of `download()` is made by the sandbox's agent, which code in the sandbox controls, so it
is hostile input. It is parsed here, not by tarfile: tarfile's parser trusts the archive (on Python
3.11.7 its pax regexes are quadratic, CVE-2024-6232; a negative size sends it back to re-read the
same header forever; global pax headers pile up and are copied into every member; sparse maps
write holes of any size; and its `data` filter is defeated by the long-path trick of CVE-2025-4517
before Python 3.11.13). Only what the agent's tarfile writes is read: ustar headers (octal or
positive base-256 numbers, checksummed), pax `x` records and GNU long names. Every member is
checked before anything is written:

* regular files and folders only; links (symbolic and hard) are skipped and reported, and a
  member below a skipped link is refused; devices, fifos, sparse files, global pax headers and
  other types refuse the archive, and so does a folder or link that claims data;
* names: not absolute, no NUL, no empty, `.` or `..` part, at most `MAX_NAME` bytes, all under
  one top member; the folder a file goes in resolves inside the target;
* sizes: at most `max_bytes` in all and `max_members` members; a member's extension headers
  (GNU long names, pax records) at most `HEADER_BUDGET` bytes, `MAX_EXTENSIONS` headers and
  `MAX_RECORDS` pax records each; the archive must hold every byte it declares and end with its
  end-of-archive block, else it is refused as truncated.

Files are written by this module (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode masked to 0o755 plus the
owner's read and write, as the `data` filter does), folders made with mkdir, inside a private
staging folder next to the target. Only a fully checked and written tree is moved into place; on
any refusal the staging folder, and any parent folder the download created, are removed and
nothing appears at the target.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from orchard.errors import AgentError, InvalidRequest, TooLarge

MAX_MEMBERS = 100_000
"""Default `max_members` of an extraction."""
MAX_NAME = 4096
"""Bytes of a member's name (PATH_MAX)."""
HEADER_BUDGET = 1024 * 1024
"""Bytes of one member's extension headers (long names, pax records)."""
MAX_EXTENSIONS = 3
"""Extension headers before one member (the agent writes one pax header; GNU tar a long name and link)."""
MAX_RECORDS = 64
"""Records in one pax header (the agent writes at most nine): parsing stays cheap per byte."""
CHUNK = 1024 * 1024
BLOCK = 512
FILE, FOLDER, HARDLINK, SYMLINK = b"0", b"5", b"1", b"2"
_OCTAL = re.compile(rb" *([0-7]*) *")
_DECIMAL = re.compile(rb"[0-9]{1,19}")


class Download:
    """An archive being downloaded to `local`: a private staging folder next to it, always removed.

    The archive is streamed into `file`; `finish` extracts it and moves its top member into place
    (to `local`, or into it when it is a folder, like cp). Parent folders of `local` that did not
    exist are created for the staging folder and removed again unless `finish` succeeds.
    """

    def __init__(self, local: Path):
        self.local = local

    def __enter__(self) -> Download:
        self.created = [folder for folder in (self.local.parent, *self.local.parent.parents) if not folder.exists()]
        self.finished = False
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(dir=self.local.parent, prefix=".orchard-download-"))
        self.file: IO[bytes] = open(self.staging / "archive.tar", "w+b")
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        shutil.rmtree(self.staging, ignore_errors=True)
        if not self.finished:
            for folder in self.created:  # deepest first; one that is no longer empty stays
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def finish(self, max_bytes: int, max_members: int = MAX_MEMBERS) -> list[str]:
        """Extract and move into place; the names of the links that were skipped (with a warning)."""
        self.file.seek(0)
        tree = self.staging / "tree"
        tree.mkdir()
        top, skipped = extract(self.file, tree, max_bytes=max_bytes, max_members=max_members)
        target = self.local / top if self.local.is_dir() else self.local
        if target.is_dir():
            raise InvalidRequest(f"{target} already exists; remove it or download elsewhere")
        if (tree / top).is_dir() and os.path.lexists(target):
            raise InvalidRequest(f"{target} is a file and the download is a folder; remove it or download elsewhere")
        os.replace(tree / top, target)
        self.finished = True
        if skipped:
            warnings.warn(
                f"download to {target}: skipped {len(skipped)} link(s) from the sandbox, such as {skipped[0]!r};"
                " links are never created on the host",
                stacklevel=3,
            )
        return skipped


def extract(archive: IO[bytes], dest: Path, *, max_bytes: int, max_members: int = MAX_MEMBERS) -> tuple[str, list[str]]:
    """Extract a tar from a sandbox into the empty folder `dest`; its top member and skipped links."""
    return _Extraction(_Reader(archive), dest, max_bytes, max_members).run()


class _Refused(AgentError):
    """A member that is never extracted (the message names it)."""


@dataclass
class _Member:
    name: str
    kind: bytes
    size: int
    mode: int
    mtime: float


class _Reader:
    """The members of a tar, read forward only: every header and byte of data is read exactly once."""

    def __init__(self, file: IO[bytes]):
        self.file = file

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise AgentError("the sandbox sent a truncated archive: it ends inside a member or lacks its end block")
        return data

    def skip_padding(self, size: int) -> None:
        self.read(-size % BLOCK)

    def next(self) -> _Member | None:
        """The next member, its data not read yet (None at the end-of-archive block)."""
        extended: dict[str, bytes] = {}
        used = extensions = 0
        while True:
            block = self.read(BLOCK)
            if not any(block):
                return None
            _check_sum(block)
            kind, size = block[156:157], _number(block[124:136], "size")
            if kind == b"g":
                raise _Refused("refused a global pax header in the sandbox's archive: the agent never writes them")
            if kind not in (b"x", b"L", b"K"):
                return self._member(block, kind, size, extended)
            used, extensions = used + BLOCK + size, extensions + 1
            if used > HEADER_BUDGET or extensions > MAX_EXTENSIONS:
                raise _Refused(
                    f"a member's headers in the archive are over {HEADER_BUDGET} bytes or {MAX_EXTENSIONS} headers"
                )
            data = self.read(size)
            self.skip_padding(size)
            if kind == b"x":
                extended.update(_pax(data))
            elif kind == b"L":  # a K (long link name) is read past: links are never created
                extended["path"] = data.split(b"\0", 1)[0]

    def _member(self, block: bytes, kind: bytes, size: int, extended: dict[str, bytes]) -> _Member:
        name = extended.get("path")
        if name is None:
            name = block[:100].split(b"\0", 1)[0]
            prefix = block[345:500].split(b"\0", 1)[0]
            if block[257:263] == b"ustar\0" and prefix:
                name = prefix + b"/" + name
        if "size" in extended:
            size = _decimal(extended["size"], "size")
        mtime: float = _number(block[136:148], "mtime")
        with contextlib.suppress(ValueError):
            mtime = float(extended.get("mtime", mtime))
        text = name.decode("utf-8", "surrogateescape")
        if kind == b"\0":
            kind = FILE
        if kind == FOLDER:
            text = text.rstrip("/")
        return _Member(text, kind, size, _number(block[100:108], "mode"), mtime)


def _check_sum(block: bytes) -> None:
    unsigned = sum(block[:148]) + sum(block[156:]) + 8 * 0x20
    signed = unsigned - 256 * sum(1 for byte in block[:148] + block[156:] if byte > 127)
    if _number(block[148:156], "checksum") not in (unsigned, signed):
        raise AgentError("the sandbox sent a broken archive: a header's checksum is wrong")


def _number(field: bytes, what: str) -> int:
    """A header's number field: octal, or GNU base-256 when positive (a negative one is refused)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    match = _OCTAL.fullmatch(field.split(b"\0", 1)[0])
    if match is None:
        raise AgentError(f"the sandbox sent a broken archive: a header's {what} is not a number of at least 0")
    return int(match.group(1) or b"0", 8)


def _decimal(value: bytes, what: str) -> int:
    if not _DECIMAL.fullmatch(value):
        raise AgentError(f"the sandbox sent a broken archive: a pax {what} is not a number of at least 0")
    return int(value)


def _pax(data: bytes) -> dict[str, bytes]:
    """The records of a pax header ("LENGTH KEY=VALUE\\n"), parsed in one pass: the few that are used."""
    records: dict[str, bytes] = {}
    pos = count = 0
    while pos < len(data):
        count += 1
        if count > MAX_RECORDS:
            raise _Refused(f"a pax header in the sandbox's archive has more than {MAX_RECORDS} records")
        space = data.find(b" ", pos, pos + 20)
        length = int(data[pos:space]) if space > pos and data[pos:space].isdigit() else 0
        record = data[pos : pos + length]
        key, equals, value = record[space - pos + 1 : -1].partition(b"=")
        if len(record) != length or not record.endswith(b"\n") or not equals:
            raise AgentError("the sandbox sent a broken archive: a pax record is malformed")
        if key.startswith(b"GNU.sparse."):
            raise _Refused("refused a sparse member of the sandbox's archive: the agent never writes them")
        if key in (b"path", b"size", b"mtime"):
            records[key.decode()] = value
        pos += length
    return records


class _Extraction:
    def __init__(self, reader: _Reader, dest: Path, max_bytes: int, max_members: int):
        self.reader, self.max_bytes, self.max_members = reader, max_bytes, max_members
        self.dest = Path(os.path.realpath(dest))
        self.top: str | None = None
        self.links: set[tuple[str, ...]] = set()
        self.skipped: list[str] = []
        self.total = 0

    def run(self) -> tuple[str, list[str]]:
        count = 0
        while (member := self.reader.next()) is not None:
            count += 1
            if count > self.max_members:
                raise TooLarge(f"the archive from the sandbox has more than {self.max_members} members")
            try:
                self._member(member)
            except OSError as exc:
                if isinstance(exc, AgentError):
                    raise
                raise _Refused(f"could not extract {member.name!r} from the sandbox's archive: {exc}") from None
        if self.top is None:
            raise AgentError("the sandbox sent an archive with no file or folder in it")
        if (self.top,) in self.links:
            raise InvalidRequest(
                f"{self.top!r} is a link in the sandbox; links are not downloaded, download its target"
            )
        return self.top, self.skipped

    def _member(self, member: _Member) -> None:
        parts = self._parts(member.name)
        through = next((parts[:n] for n in range(1, len(parts)) if parts[:n] in self.links), None)
        if through is not None:
            raise _Refused(
                f"refused {member.name!r} from the sandbox's archive: it goes through the link {'/'.join(through)!r}"
            )
        if member.kind not in (FILE, FOLDER, HARDLINK, SYMLINK):
            raise _Refused(f"refused {member.name!r} from the sandbox's archive: only files and folders are extracted")
        if member.size and member.kind != FILE:
            raise _Refused(f"refused {member.name!r} from the sandbox's archive: a folder or link that holds data")
        if member.kind in (HARDLINK, SYMLINK):
            self.links.add(parts)
            self.skipped.append(member.name)
        elif member.kind == FOLDER:
            self._folder(parts).mkdir(exist_ok=True)
        else:
            self.total += member.size
            if self.total > self.max_bytes:
                raise TooLarge(
                    f"the archive from the sandbox holds more than {self.max_bytes} bytes (at {member.name!r});"
                    " pass a larger max_bytes to download()"
                )
            self._file(member, parts)

    def _parts(self, name: str) -> tuple[str, ...]:
        """The parts of a member's name, checked (else `_Refused`)."""
        problem = None
        if "\x00" in name:
            problem = "holds a NUL byte"
        elif name.startswith("/"):
            problem = "is absolute"
        elif len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
            problem = f"is longer than {MAX_NAME} bytes"
        elif any(part in ("", ".", "..") for part in name.split("/")):
            problem = "has an empty, '.' or '..' part"
        if problem:
            raise _Refused(f"refused {name[:200]!r} from the sandbox's archive: its name {problem}")
        parts = tuple(name.split("/"))
        if self.top is None:
            self.top = parts[0]
        elif parts[0] != self.top:
            raise _Refused(f"refused {name!r} from the sandbox's archive: it is not under its top member {self.top!r}")
        return parts

    def _folder(self, parts: tuple[str, ...]) -> Path:
        """The path of `parts` in the target, once its parent folders exist and resolve inside it."""
        parent = self.dest.joinpath(*parts[:-1])
        parent.mkdir(parents=True, exist_ok=True)
        if os.path.commonpath([os.path.realpath(parent), self.dest]) != str(self.dest):
            raise _Refused(f"refused {'/'.join(parts)!r} from the sandbox's archive: it resolves outside the target")
        return parent / parts[-1]

    def _file(self, member: _Member, parts: tuple[str, ...]) -> None:
        path = self._folder(parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(path, flags, 0o600), "wb") as out:
            for start in range(0, member.size, CHUNK):
                out.write(self.reader.read(min(CHUNK, member.size - start)))
            self.reader.skip_padding(member.size)
            out.flush()
            os.fchmod(out.fileno(), member.mode & 0o755 | 0o600)
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(out.fileno(), (member.mtime, member.mtime))
