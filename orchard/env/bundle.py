"""A self-contained runtime for the exec agent, built from the host's own Python.

Why a bundle: sandboxes run task images *unmodified*. An image may have no Python at all (a static
busybox, a distroless image), no libc, or a python3 that is older, newer or broken. So instead of
installing anything into the image, Orchard bind-mounts this folder read-only (at `/.orchard` by
default) and starts the agent with it:

    /.orchard/lib/ld-linux-x86-64.so.2 --library-path /.orchard/lib \\
        /.orchard/bin/python3 -s -S -B /.orchard/agent/__main__.py --unix ... --workdir ...

with `PYTHONHOME=/.orchard PYTHONUTF8=1 PYTHONDONTWRITEBYTECODE=1` (see `Bundle.command` and
`Bundle.environment`). Orchard's own programs in sandboxes (`orchard.env.sandboxed`: the Claw
services, the GUI sites) run on the same interpreter, so they too need no Python in the image: a
task starts them with `sandbox_python()`, the shell words of `Bundle.python` and its environment.

Why through the bundled dynamic linker: the interpreter's ELF header names the host's linker
(`/lib64/ld-linux-x86-64.so.2`), which the image may lack or carry in another glibc version.
Running the bundled linker as the program, with `--library-path`, makes it load the bundled
libc, libpython and friends, whatever the image holds. Unlike `LD_LIBRARY_PATH`, the option is
not inherited: the commands the agent starts use the image's own libraries. The agent must still
drop `PYTHONHOME` (and the other `PYTHON*` variables) from its children's environment.

What is carried (layout):

* `bin/python3`: the host interpreter binary (the file `sys.executable` resolves to);
* `bin/orchard-subreaper` (x86-64 hosts): a 61-byte static program, `prctl(PR_SET_CHILD_SUBREAPER)`
  then `execve(argv[1], argv + 1)`, that the agent puts in front of every command, so that what a
  command starts stays in its process tree even after `setsid` and a double fork (see
  `SUBREAPER_X86_64`);
* `lib/`: every shared library that binary and the carried extension modules need, found with
  `ldd` (libpython, libc, libm, libssl, ...), plus the dynamic linker and `libgcc_s` (glibc
  loads it to unwind a thread at exit); real files under their soname, no symlinks, debug
  symbols stripped when `strip` is available;
* `lib/python3XY.zip`: the pure-Python standard library modules the agent imports (the import
  closure of the agent package, computed by importing its modules in the same interpreter, plus
  a few modules the standard library imports lazily, `LAZY_MODULES`, and those Orchard's
  programs in sandboxes import, `SERVER_MODULES`) and the whole `encodings` package, as
  unchecked hash-based `.pyc`, stored uncompressed so zipimport needs no zlib. CPython puts
  `$PYTHONHOME/lib/python3XY.zip` on `sys.path` by itself; with `PYTHONHOME` set it searches no
  landmark, so startup prints no warning;
* `lib/python3.X/lib-dynload/`: the extension modules of that closure;
* `agent/`: the agent package (`orchard/env/agent/*.py`, with their bytecode in `__pycache__`,
  as for the standard library: a start compiles nothing but the entry), started by its
  `__main__.py`, which imports the package as `agent` from `/.orchard`; `bundle.json`: a manifest (linker name,
  versions, counts).

What is not carried: NSS modules (glibc only has its built-in `files` backend: avoid user and
group *name* lookups), locale and gconv files (hence UTF-8 mode), CA certificates, site-packages,
the CJK codecs' extension modules, and any module imported lazily (inside a function) that is
neither in the agent's top-level closure nor in `LAZY_MODULES`.

Limits: the bundle runs on the host's CPU architecture (and a Linux kernel no older than the
host glibc supports); the agent must be a stdlib-only package (with a `__main__.py`) whose
modules import each other relatively and the standard library at top level.

Bundles live in `<cache_dir>/agent-bundle/<hash>/`, keyed by the interpreter, libpython, the
agent package's sources, `FORMAT_VERSION` and this module's own source. A build is atomic (`os.rename` of
a finished folder), so concurrent builders never see or leave a half-built bundle.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import marshal
import os
import platform
import re
import shlex
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from orchard.config import settings
from orchard.errors import ConfigError

FORMAT_VERSION = 4
"""Bump when the layout or the build changes, so older cached bundles are not reused."""
DEFAULT_AGENT = Path(__file__).resolve().parent / "agent"
"""The agent package, which the bundle carries as `agent/` and starts by its `AGENT_ENTRY`."""
AGENT_ENTRY = "__main__.py"
DEFAULT_MOUNT = "/.orchard"
MANIFEST = "bundle.json"
EXTRA_LIBRARIES = ("libgcc_s.so.1",)
"""Loaded with dlopen by glibc (thread cancellation/exit), so `ldd` does not list them."""
LAZY_MODULES = [
    "ctypes",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.utf_8",
    "fcntl",
    "gzip",
    "termios",
    "traceback",
]
"""Imported only when needed by code paths an agent hits: `ctypes` (the agent's `prctl` at start),
the common codecs, `tarfile.open` with "r:*" (gzip), `socketserver`'s error handler (traceback),
the terminal of ``/pty`` (fcntl, termios). Bundled with their closure."""
SERVER_MODULES = [
    "calendar",
    "copy",
    "datetime",
    "hashlib",
    "html",
    "json",
    "re",
    "socket",
    "socketserver",
    "string",
    "subprocess",
    "threading",
    "time",
    "traceback",
    "urllib.parse",
]
"""What Orchard's programs in sandboxes import (the Claw services, the GUI sites and their HTTP
layer, `orchard.env.sandboxed.httpd`, the script that starts Chromium), lazily too (`hashlib`: the Claw world's injected errors at a
rate; it brings libcrypto), and what a GUI site module may import besides (`datetime`, `calendar`,
`html`, `string`): bundled with their closure whatever the agent imports, since these programs run
on the bundle's interpreter (`sandbox_python`)."""
SUBREAPER_X86_64 = bytes.fromhex(
    "bf24000000"  # mov edi, 36: PR_SET_CHILD_SUBREAPER
    "be01000000"  # mov esi, 1
    "31d2"  # xor edx, edx
    "4531d2"  # xor r10d, r10d
    "4531c0"  # xor r8d, r8d
    "b89d000000"  # mov eax, 157: prctl
    "0f05"  # syscall
    "488b1424"  # mov rdx, [rsp]: argc
    "488d742410"  # lea rsi, [rsp + 16]: argv + 1
    "488b3e"  # mov rdi, [rsi]: argv[1]
    "488d54d410"  # lea rdx, [rsp + 8 * rdx + 16]: envp
    "b83b000000"  # mov eax, 59: execve
    "0f05"  # syscall
    "bf7f000000"  # mov edi, 127: execve failed, exit 127 as a shell would
    "b8e7000000"  # mov eax, 231: exit_group
    "0f05"  # syscall
)
"""Machine code of `bin/orchard-subreaper` (GNU as, Intel syntax, of the listing on the right)."""
STALE_BUILD_S = 3600
"""A temporary build folder older than this is a crashed builder's leftover, safe to remove."""
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Bundle:
    """A built agent bundle: a folder to bind-mount read-only into a container."""

    path: Path

    @cached_property
    def manifest(self) -> dict[str, object]:
        """The bundle's `bundle.json`: linker name, Python version, module and library counts (read
        once: a built bundle does not change)."""
        return dict(json.loads((self.path / MANIFEST).read_text()))

    @property
    def linker(self) -> str:
        """File name of the bundled dynamic linker, e.g. `ld-linux-x86-64.so.2`."""
        return str(self.manifest["linker"])

    def python(self, mount: str = DEFAULT_MOUNT) -> list[str]:
        """The argv of the bundle's interpreter when the bundle is mounted at `mount`; append a
        standard-library program and its arguments, and run it with `environment(mount)`."""
        return [
            f"{mount}/lib/{self.linker}",
            "--library-path",
            f"{mount}/lib",
            f"{mount}/bin/python3",
            "-s",
            "-S",
            "-B",
        ]

    def command(self, mount: str = DEFAULT_MOUNT) -> list[str]:
        """The argv starting the agent when the bundle is mounted at `mount`; append agent args."""
        return [*self.python(mount), f"{mount}/agent/{AGENT_ENTRY}"]

    def environment(self, mount: str = DEFAULT_MOUNT) -> dict[str, str]:
        """The environment variables the interpreter needs when the bundle is mounted at `mount`."""
        return {"PYTHONHOME": mount, "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def size(self) -> int:
        """Total size of the bundle's files, in bytes."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


def sandbox_python(mount: str = DEFAULT_MOUNT) -> str:
    """Shell words that run the bundle's interpreter inside a sandbox, where the bundle is mounted
    at `mount` (both backends mount it at `DEFAULT_MOUNT`): `env`, `Bundle.environment`, then
    `Bundle.python`; append a standard-library program and its arguments. The dynamic linker is
    named by a glob, the one `ld-*` of the bundle's `lib/`, which the sandbox's shell expands, so
    the host needs no bundle of its own (a client of a remote service may run on another system).
    The image needs a POSIX shell and `env`, no Python."""
    home = shlex.quote(mount)
    return (
        f"env PYTHONHOME={home} PYTHONUTF8=1 PYTHONDONTWRITEBYTECODE=1 "
        f"{home}/lib/ld-* --library-path {home}/lib {home}/bin/python3 -s -S -B"
    )


def build_bundle(agent: Path = DEFAULT_AGENT, cache_dir: Path | None = None) -> Bundle:
    """Build the bundle for the agent package `agent` under `cache_dir` (default: the settings'), or reuse it.

    A cache hit only hashes the inputs (memoised per file): no subprocess, no copy.
    """
    _check_host()
    interpreter = Path(os.path.realpath(sys.executable))
    agent = Path(agent).resolve()
    if not (agent / AGENT_ENTRY).is_file():
        raise ConfigError(f"agent package {agent} is missing (no {AGENT_ENTRY} in it)")
    root = Path(cache_dir or settings().cache_dir) / "agent-bundle"
    final = root / _bundle_key(interpreter, agent)
    if (final / MANIFEST).is_file():
        return Bundle(final)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(root)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        _assemble(work, interpreter, agent)
        _publish(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Bundle(final)


def _check_host() -> None:
    """ConfigError unless this host has what building a bundle needs (Linux, ldd)."""
    if not sys.platform.startswith("linux"):
        raise ConfigError(f"the agent bundle needs a Linux host, not {sys.platform}")
    if shutil.which("ldd") is None:
        raise ConfigError("`ldd` is missing: install libc-bin (glibc's tools) to build the bundle")


def _bundle_key(interpreter: Path, agent: Path) -> str:
    """Content hash of everything the bundle is built from."""
    digest = hashlib.sha256(f"orchard-agent-bundle {FORMAT_VERSION}\n".encode())
    digest.update(f"strip={_strip_tool() is not None}\n".encode())
    for path in (interpreter, _libpython(), Path(__file__)):  # this file: the recipe
        if path is not None:
            digest.update(_file_digest(path).encode())
    for module in _agent_modules(agent):
        digest.update(f"{module.name}\0{_file_digest(module)}\n".encode())
    return digest.hexdigest()[:20]


def _agent_modules(agent: Path) -> list[Path]:
    """The source files of the agent package, by name."""
    return sorted(agent.glob("*.py"))


def _libpython() -> Path | None:
    """The shared libpython of this interpreter, or None when it is statically linked."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    path = Path(str(sysconfig.get_config_var("LIBDIR"))) / str(name)
    return path if path.is_file() else None


def _file_digest(path: Path) -> str:
    """SHA-256 of a file, memoised by its identity and modification time."""
    st = path.stat()
    return _digest_of(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _digest_of(path: str, _inode: int, _size: int, _mtime_ns: int) -> str:
    """SHA-256 of the file at `path` (the other arguments only key the cache)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _remove_stale_builds(root: Path) -> None:
    """Remove temporary build folders that crashed builders left long ago."""
    limit = time.time() - STALE_BUILD_S
    for leftover in root.glob(".build-*"):
        try:
            if leftover.stat().st_mtime < limit:
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            pass  # another builder just removed or published it


def _publish(work: Path, final: Path, manifest: str = MANIFEST) -> None:
    """Rename the finished `work` folder to `final`; losing the race to another builder is fine
    (a folder is finished when its `manifest` is there)."""
    try:
        os.rename(work, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not (final / manifest).is_file():
            raise ConfigError(f"{final} is not a finished bundle: delete it and retry") from exc


# ---------------------------------------------------------------------------------------------
# assembling
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Closure:
    """What the agent imports, as reported by the interpreter to bundle."""

    version: tuple[int, int]
    stdlib: Path
    sources: list[Path]
    extensions: list[Path]


def _assemble(dest: Path, interpreter: Path, agent: Path) -> None:
    """Lay the whole bundle out in the (empty) folder `dest`."""
    closure = _module_closure(interpreter, agent)
    major, minor = closure.version
    lib = dest / "lib"
    dynload = lib / f"python{major}.{minor}" / "lib-dynload"
    for folder in (dest / "bin", dest / "agent", dynload):
        folder.mkdir(parents=True)
    _copy(interpreter, dest / "bin" / "python3", executable=True)
    _write_agent(dest / "agent", agent)
    if platform.machine() == "x86_64":
        (dest / "bin" / "orchard-subreaper").write_bytes(_static_elf(SUBREAPER_X86_64))
        (dest / "bin" / "orchard-subreaper").chmod(0o755)
    modules = _write_stdlib_zip(lib / f"python{major}{minor}.zip", closure)
    for ext in closure.extensions:
        _copy(ext, dynload / ext.name, executable=True)
    linker, libraries = _shared_libraries([interpreter, *closure.extensions])
    for name, source in libraries.items():
        _copy(source, lib / name, executable=True)
    _copy(linker, lib / linker.name, executable=True)
    _strip_debug_info([dest / "bin" / "python3", *lib.glob("lib*.so*"), *dynload.iterdir()])
    for folder in (dest, *(p for p in dest.rglob("*") if p.is_dir())):
        folder.chmod(0o755)
    manifest = {
        "format": FORMAT_VERSION,
        "python": f"{major}.{minor}",
        "linker": linker.name,
        "interpreter": str(interpreter),
        "agent": str(agent),
        "modules": modules,
        "extensions": sorted(e.name for e in closure.extensions),
        "libraries": sorted(libraries),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


_PROBE = """
import importlib, json, os, sys
agent, out = sys.argv[1], sys.argv[2]
package = os.path.basename(agent)
sys.path.append(os.path.dirname(agent))  # after the standard library, as the agent's entry puts it
for name in sorted(f[:-3] for f in os.listdir(agent) if f.endswith(".py")):
    importlib.import_module(package if name == "__init__" else f"{package}.{name}")
for name in sys.argv[3:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
ours = {n for n in sys.modules if n == package or n.startswith(package + ".")}
files = {getattr(m, "__file__", None) for n, m in list(sys.modules.items()) if n not in ours}
with open(out, "w") as f:
    json.dump({"version": sys.version_info[:2], "stdlib": sys._stdlib_dir,
               "files": sorted(x for x in files if x)}, f)
"""


def _module_closure(interpreter: Path, agent: Path) -> _Closure:
    """Import every module of the package `agent` (`__main__` too, not as the main module) in an
    isolated `interpreter`; list the files of the other modules it loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "closure.json"
        argv = [str(interpreter), "-I", "-S", "-B", "-c", _PROBE, str(agent), str(out)]
        argv += [*LAZY_MODULES, *SERVER_MODULES]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp)
        if proc.returncode != 0 or not out.is_file():
            last = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            raise ConfigError(f"cannot import the agent {agent} in {interpreter}: {last[0]}")
        report = json.loads(out.read_text())
    version = (int(report["version"][0]), int(report["version"][1]))
    if version != sys.version_info[:2]:
        raise ConfigError(f"{interpreter} is Python {version}, not this process's Python")
    stdlib = Path(report["stdlib"])
    files = [Path(f) for f in report["files"]]
    sources = {f for f in files if f.suffix == ".py"}
    sources |= set((stdlib / "encodings").glob("*.py"))
    extensions = sorted(f for f in files if f.suffix == ".so")
    outside = [f for f in sources if not f.is_relative_to(stdlib)]
    unknown = [f for f in files if f.suffix not in (".py", ".so")]
    if outside or unknown:
        raise ConfigError(f"the agent imports modules from outside the standard library: {(outside + unknown)[0]}")
    return _Closure(version, stdlib, sorted(sources), extensions)


def _write_agent(target: Path, agent: Path) -> None:
    """Copy the agent package's sources into `target`, each but the entry (a script: compiled from
    its source whenever it runs) with its bytecode in `__pycache__`, unchecked hash-based as the
    standard library's, so a sandbox's start compiles none of the package."""
    cache = target / "__pycache__"
    cache.mkdir()
    for module in _agent_modules(agent):
        _copy(module, target / module.name)
        if module.name != AGENT_ENTRY:
            compiled = cache / f"{module.stem}.{sys.implementation.cache_tag}.pyc"
            compiled.write_bytes(_pyc(module.read_bytes(), f"{DEFAULT_MOUNT}/agent/{module.name}"))
            compiled.chmod(0o644)


def _write_stdlib_zip(target: Path, closure: _Closure) -> int:
    """Write the closure's pure-Python modules as `.pyc` into an uncompressed zip; return count."""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as archive:
        for source in closure.sources:
            relative = source.relative_to(closure.stdlib).with_suffix(".pyc").as_posix()
            shown = f"{DEFAULT_MOUNT}/lib/{target.name}/{relative[:-1]}"
            info = zipfile.ZipInfo(relative, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, _pyc(source.read_bytes(), shown))
    target.chmod(0o644)
    return len(closure.sources)


def _pyc(source: bytes, filename: str) -> bytes:
    """Bytecode file contents for `source`: unchecked hash-based (PEP 552), so no mtime is read."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    flags = 0b01  # hash-based, do not check the source
    header = importlib.util.MAGIC_NUMBER + struct.pack("<I", flags)
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def _shared_libraries(binaries: list[Path]) -> tuple[Path, dict[str, Path]]:
    """The dynamic linker of `binaries[0]` and every library they need: {soname: real file}."""
    interp = elf_interpreter(binaries[0])
    if interp is None:
        raise ConfigError(f"{binaries[0]} is statically linked: nothing to bundle it with")
    linker = Path(interp)
    libraries: dict[str, Path] = {}
    for binary in binaries:
        for name, path in _ldd(binary).items():
            if Path(name).name != linker.name:
                libraries.setdefault(Path(name).name, path)
    folders = {p.parent for p in libraries.values()}
    for extra in EXTRA_LIBRARIES:
        found = [folder / extra for folder in sorted(folders) if (folder / extra).is_file()]
        if found and extra not in libraries:
            libraries[extra] = found[0]
    return linker, libraries


_LDD_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
_LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found")


def _ldd(binary: Path) -> dict[str, Path]:
    """{needed name: resolved path} from `ldd binary`; ConfigError when one is not found."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "statically linked" not in proc.stdout + proc.stderr:
        raise ConfigError(f"`ldd {binary}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    found: dict[str, Path] = {}
    for line in proc.stdout.splitlines():
        if missing := _LDD_MISSING.match(line):
            raise ConfigError(f"{binary} needs {missing.group(1)}, which ldd cannot find")
        if match := _LDD_FOUND.match(line):
            found[match.group(1)] = Path(match.group(2))
    return found


def elf_interpreter(path: Path) -> str | None:
    """The dynamic linker an ELF file names (its PT_INTERP header), or None for a static binary."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF":
            raise ConfigError(f"{path} is not an ELF file")
        order = "<" if head[5] == 1 else ">"
        if head[4] == 2:  # 64-bit: e_phoff at 0x20; p_offset at +8, p_filesz at +32
            word, phoff_at, count_at, offset_at, size_at = "Q", 0x20, 0x36, 8, 32
        else:  # 32-bit: e_phoff at 0x1C; p_offset at +4, p_filesz at +16
            word, phoff_at, count_at, offset_at, size_at = "I", 0x1C, 0x2A, 4, 16
        (phoff,) = struct.unpack_from(order + word, head, phoff_at)
        entry, count = struct.unpack_from(order + "HH", head, count_at)
        f.seek(phoff)
        table = f.read(entry * count)
        for start in range(0, entry * count, entry):
            if struct.unpack_from(order + "I", table, start)[0] == 3:  # PT_INTERP
                (offset,) = struct.unpack_from(order + word, table, start + offset_at)
                (length,) = struct.unpack_from(order + word, table, start + size_at)
                f.seek(offset)
                return f.read(length).rstrip(b"\0").decode()
    return None


def _static_elf(code: bytes, base: int = 0x400000) -> bytes:
    """A minimal x86-64 ELF executable running `code`: one read+execute segment, a non-executable stack."""
    headers = 64 + 2 * 56
    size = headers + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    elf = ident + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + headers, 64, 0, 0, 64, 56, 2, 0, 0, 0)
    elf += struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # PT_LOAD, R+X
    elf += struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16)  # PT_GNU_STACK, RW
    return elf + code


def _copy(source: Path, target: Path, *, executable: bool = False) -> None:
    """Copy the real file behind `source` (never a link) to `target`, readable by everyone."""
    shutil.copyfile(os.path.realpath(source), target)
    target.chmod(0o755 if executable else 0o644)


def _strip_tool() -> str | None:
    """The `strip` binary, when the host has binutils."""
    return shutil.which("strip")


def _strip_debug_info(files: list[Path]) -> None:
    """Drop debug sections from the copied ELF files (a 23 MB libpython becomes 6 MB)."""
    tool = _strip_tool()
    if tool is None or not files:
        return
    subprocess.run([tool, "--strip-debug", *map(str, files)], capture_output=True, timeout=120, check=False)
