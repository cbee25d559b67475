"""Base images built offline: no registry, only a Debian mirror (or nothing at all).

* `build_base()` makes `orchard/base:<release>` (`RELEASES`: bullseye ships Python 3.9, bookworm
  3.11, trixie 3.13; bookworm is the default), a minimal Debian with python3, pytest, git, patch,
  bash and ca-certificates (enough to build and test Python repositories offline; task images put
  a venv on top, `orchard.recipes.swe.environments`): `debootstrap --variant=minbase` into a root
  filesystem kept under `settings().cache_dir / "rootfs"`, then `docker import` of that tree
  (45 s to 2 min the first time, per release; about 10 s from the cached tree). The image's
  labels say its release, Python and glibc versions (`base_facts`): task images pick wheels by
  them.
* `build_busybox()` makes `orchard/busybox:static`, an image that holds only Debian's static
  busybox and its applet links: no Python, no libc, no bash. It needs no network (about 1 s).
* `build_agent()` makes `orchard/agent:<version>`, the injector of the Kubernetes backend: the
  static busybox at `/bin/busybox` and the agent bundle (`orchard.env.bundle`) at
  `/orchard-bundle/`. A Pod's init container runs it with `INJECT_COMMAND`, copying the bundle
  into the `emptyDir` the task's unmodified image then starts the agent from. It needs no
  network (a second or two); a real cluster pulls it from the lab's registry, so push it there.

The service's own image for a cluster, `orchard/orchard:<version>`, is `orchard.deploy`'s: it
installs Orchard's wheel from a wheelhouse (`orchard.tasks.wheelhouse`, a layer above this one).

All return the image reference and are cached: when the tag exists (for the base, built from
the same package list; for the injector, holding the same bundle) they return at once, unless
`force=True`. The engine is reached with `docker.from_env()`; an unreachable engine raises
`EngineUnavailable`, a host that cannot build raises `ConfigError` saying what to do.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from pathlib import Path

import docker
import docker.errors

from orchard import __version__
from orchard.config import settings
from orchard.env.bundle import Bundle, build_bundle, elf_interpreter
from orchard.errors import ConfigError, EngineUnavailable
from orchard.registry import load

Log = Callable[[str], None]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
"""The release whose entry in the host's apt sources names the mirror (it serves every release)."""
RELEASES = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
"""The Debian releases a base image is built from, and the Python each ships."""
DEFAULT_RELEASE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pytest", "git", "bash", "ca-certificates", "patch")
"""What the base image holds beyond minbase: enough to build and test Python repositories offline.
No compiler (gcc, libc6-dev and python3-dev would add about 150-230 MiB to each release's ~270 MB):
a source distribution that needs one fails its task image's build, naming the package."""
RELEASE_PACKAGES = {"bullseye": ("python3-distutils",)}
"""What a release's python3 lacks of the standard library that pip and setuptools need there
(from 3.12 on there is no distutils)."""
PACKAGES_LABEL = "org.orchard.base-packages"
RELEASE_LABEL = "org.orchard.base-release"
PYTHON_LABEL = "org.orchard.base-python"
"""The full version of the base image's python3 (`3.9.2`)."""
GLIBC_LABEL = "org.orchard.base-glibc"
"""Its C library's version (`2.31`): the newest manylinux wheels it runs."""
BUSYBOX = Path("/bin/busybox")
LABEL = "org.orchard.built-by=orchard"
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MTIME = 946684800
"""Fixed timestamp (2000-01-01) of the busybox image files, so a rebuild is byte-identical."""
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
ROOTFS_DONE = "debootstrap.done"
"""Marker file written next to a root filesystem once debootstrap has finished."""


# ---------------------------------------------------------------------------------------------
# engine
# ---------------------------------------------------------------------------------------------


def docker_client() -> docker.DockerClient:
    """A client for the engine of the environment (DOCKER_HOST, or the local socket)."""
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot reach the Docker engine ({exc}); start it or set DOCKER_HOST") from exc
    return client


def image_exists(tag: str) -> bool:
    """Whether the engine holds an image with this reference."""
    with closing(docker_client()) as client:
        return _image_id(client, tag) is not None


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    """The id of image `tag`, or None when the engine has none by that name."""
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None


def _image_labels(client: docker.DockerClient, tag: str) -> dict[str, str]:
    """The labels of image `tag` ({} when the engine has none by that name)."""
    try:
        return dict(client.images.get(tag).labels or {})
    except docker.errors.ImageNotFound:
        return {}


def _packages(release: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return (*BASE_PACKAGES, *RELEASE_PACKAGES.get(release, ()), *extra)


def _packages_key(release: str = DEFAULT_RELEASE, extra: tuple[str, ...] = ()) -> str:
    """Names the package set of a base image, so a changed set rebuilds it."""
    return hashlib.sha256(",".join(_packages(release, extra)).encode()).hexdigest()[:12]


def import_rootfs(client: docker.DockerClient, tar: Path | bytes, tag: str, changes: Iterable[str]) -> str:
    """`docker import` a root filesystem tarball (a file or bytes) as `tag`; return the image id.

    An image that `tag` named before is removed when nothing else uses it.
    """
    previous = _image_id(client, tag)
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:  # no tag given: "name" or "host:port/name"
        repository, version = tag, "latest"
    api = client.api
    kwargs = {"repository": repository, "tag": version, "changes": list(changes)}
    if isinstance(tar, bytes):
        answer = api.import_image_from_data(tar, **kwargs)
    else:
        answer = api.import_image(src=str(tar), **kwargs)
    for line in str(answer).splitlines():
        message = json.loads(line) if line.strip() else {}
        if "error" in message:
            raise ConfigError(f"docker import of {tag} failed: {message['error']}")
    image_id = _image_id(client, tag)
    if image_id is None:
        raise ConfigError(f"docker import of {tag} reported success but the image is missing")
    if previous and previous != image_id:
        with suppress(docker.errors.APIError):  # still used by a container or another tag
            client.images.remove(previous)
    return image_id


@contextmanager
def _build_lock(tag: str) -> Iterator[None]:
    """Serialise the builders of `tag` across processes (pytest-xdist workers, parallel CLIs)."""
    folder = settings().cache_dir / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    with open(folder / f"image-{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def build_lock(tag: str) -> AbstractContextManager[None]:
    """The lock every builder of image `tag` holds, across processes and threads, so an image built
    elsewhere (`orchard.recipes.claw.claweval.build_image`) is built once, as these are."""
    return _build_lock(tag)


def _changes(cmd: list[str], path: str) -> list[str]:
    """Dockerfile instructions applied at import: PATH, UTF-8, working folder, command, label."""
    return [
        f"ENV PATH={path}",
        "ENV LANG=C.UTF-8",
        "WORKDIR /",
        f"CMD {json.dumps(cmd)}",
        f"LABEL {LABEL}",
    ]


# ---------------------------------------------------------------------------------------------
# Debian base image
# ---------------------------------------------------------------------------------------------


def base_tag(release: str = DEFAULT_RELEASE) -> str:
    """The tag of the base image of a Debian release."""
    return f"orchard/base:{release}"


def build_base(
    tag: str | None = None,
    *,
    release: str = DEFAULT_RELEASE,
    force: bool = False,
    mirror: str | None = None,
    log: Log | None = None,
    extra: tuple[str, ...] = (),
) -> str:
    """Build (or reuse) the minimal Debian `release` image of `BASE_PACKAGES` (and its
    `RELEASE_PACKAGES`, and `extra`); return its tag, `base_tag(release)` unless `tag` is given.

    Needs root and debootstrap on the host, and a reachable Debian mirror (the host's own, from
    its apt sources, unless `mirror` is given). The root filesystem is cached, so a rebuild with
    `force=True` only re-imports it.
    """
    if release not in RELEASES:
        raise ConfigError(f"no Debian release {release!r}: choose one of {', '.join(RELEASES)}")
    tag = tag or base_tag(release)
    say = log or quiet
    key = _packages_key(release, extra)
    with closing(docker_client()) as client, _build_lock(tag):
        labels = _image_labels(client, tag)
        if not force and labels.get(PACKAGES_LABEL) == key and labels.get(RELEASE_LABEL) == release:
            return tag
        if os.geteuid() != 0:
            raise ConfigError(
                f"building {tag} needs root (debootstrap, reading the whole tree): "
                "run as root once, or pass an existing image"
            )
        started = time.monotonic()
        rootfs = ensure_rootfs(mirror or find_mirror(), release=release, extra=extra, log=say)
        python, glibc = _installed_versions(rootfs)
        say(f"importing {rootfs} as {tag} (Python {python}, glibc {glibc})")
        with _tarball(rootfs) as tar:
            changes = [
                *_changes(["/bin/bash"], SEARCH_PATH),
                f"LABEL {PACKAGES_LABEL}={key} {RELEASE_LABEL}={release}",
                f"LABEL {PYTHON_LABEL}={python} {GLIBC_LABEL}={glibc}",
            ]
            import_rootfs(client, tar, tag, changes)
        say(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def image_builders() -> dict[str, str]:
    """Every image `orchard image build` makes: these and the recipes', `name -> "module:build"`."""
    from orchard.env import IMAGES
    from orchard.recipes import merged

    return IMAGES | merged("images")


def build_image(name: str, *, force: bool = False, log: Log | None = None, **options: object) -> str:
    """Build (or reuse) the image called `name` in `image_builders()`, passing its builder `options`
    besides `force` and `log`; return its tag."""
    return str(load(image_builders(), name, "image", form="function")(force=force, log=log, **options))


def base_facts(labels: dict[str, str]) -> tuple[str, str] | None:
    """(Python version, glibc version) of a base image, from its labels; None for an image that
    was not built by `build_base` (or by an older Orchard: rebuild it)."""
    python, glibc = labels.get(PYTHON_LABEL), labels.get(GLIBC_LABEL)
    return (python, glibc) if python and glibc else None


def _installed_versions(rootfs: Path) -> tuple[str, str]:
    """The upstream versions of python3 and libc6 in a Debian tree, from its dpkg database."""
    status = (rootfs / "var/lib/dpkg/status").read_text(errors="replace")
    versions = dict(re.findall(r"^Package: (\S+)\n(?:[^\n]+\n)*?Version: (?:\d+:)?([^\s-]+)", status, re.MULTILINE))
    python = next((v for k, v in versions.items() if re.fullmatch(r"python3\.\d+-minimal", k)), None)
    glibc = versions.get("libc6")
    if python is None or glibc is None:
        raise ConfigError(f"{rootfs} has no python3 or libc6 in its dpkg database: remove it and build again")
    return python, glibc


def ensure_rootfs(
    mirror: str, *, release: str = DEFAULT_RELEASE, extra: tuple[str, ...] = (), log: Log | None = None
) -> Path:
    """Return a finished debootstrap tree of `release` (with the base packages and `extra`) from
    `mirror`, running debootstrap only when needed."""
    say = log or quiet
    folder = settings().cache_dir / "rootfs" / f"debian-{release}-minbase-{_packages_key(release, extra)}"
    rootfs, done = folder / "root", folder / ROOTFS_DONE
    if done.is_file() and rootfs.is_dir():
        say(f"reusing root filesystem {rootfs}")
        return rootfs
    debootstrap = _debootstrap_binary()
    if rootfs.exists():
        say(f"removing half-finished root filesystem {rootfs}")
        _remove_tree(rootfs)
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        debootstrap,
        "--variant=minbase",
        f"--include={','.join(_packages(release))}",
        release,
        str(rootfs),
        mirror,
    ]
    say("running " + " ".join(argv))
    _run_logged(argv, say)
    if extra:  # apt, not debootstrap: it resolves alternatives (chromium needs `dbus-session-bus | ...`)
        _apt_install(rootfs, extra, say)
    _slim(rootfs)
    done.write_text(mirror + "\n")
    return rootfs


def _apt_install(rootfs: Path, packages: tuple[str, ...], say: Log) -> None:
    """Install `packages` (and what they depend on, no recommends) into a debootstrap tree with its
    own apt, from the mirror debootstrap wrote into its sources."""
    shutil.copyfile("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": SEARCH_PATH, "LC_ALL": "C"}
    apt = ["chroot", str(rootfs), "apt-get", "-q", "-o", "Dpkg::Use-Pty=0"]
    say(f"installing {' '.join(packages)} with apt")
    for argv in ([*apt, "update"], [*apt, "install", "-y", "--no-install-recommends", *packages]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace")
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise ConfigError(f"apt-get {argv[6]} in {rootfs} failed (exit {done.returncode}): {tail}")
    (rootfs / "etc/resolv.conf").unlink()


def _debootstrap_binary() -> str:
    """The debootstrap executable; ConfigError when it is missing."""
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin:/usr/local/sbin")
    if found is None:
        raise ConfigError("debootstrap is missing: `apt-get install debootstrap`, or pass an existing image")
    return found


def _run_logged(argv: list[str], say: Log) -> None:
    """Run `argv`, passing each output line to `say`; ConfigError with the tail when it fails."""
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(line.rstrip())
            tail = [*tail[-9:], line.rstrip()]
    if proc.returncode != 0:
        last = " | ".join(tail[-3:])
        raise ConfigError(
            f"{Path(argv[0]).name} failed (exit {proc.returncode}): {last}; "
            "check the mirror (pass mirror=...) and the network"
        )


def _slim(rootfs: Path) -> None:
    """Drop the downloaded packages and apt lists: the image does not need them."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*", "debootstrap"):
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _remove_tree(root: Path) -> None:
    """Remove `root`, first detaching what a crashed debootstrap left mounted inside it."""
    inside = [m for m in _mount_points() if m == root or root in m.parents]
    for mount in sorted(inside, key=lambda m: len(m.parts), reverse=True):
        subprocess.run(["umount", "--lazy", str(mount)], check=False, capture_output=True)
    if any(m == root or root in m.parents for m in _mount_points()):
        raise ConfigError(f"{root} still has file systems mounted inside: unmount them first")
    shutil.rmtree(root)


def _mount_points() -> list[Path]:
    """Mount points of this process's mount namespace."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    # Fields are octal-escaped (a space is \040).
    unescape = re.compile(r"\\([0-7]{3})")
    return [
        Path(unescape.sub(lambda m: chr(int(m.group(1), 8)), line.split()[1]))
        for line in lines
        if len(line.split()) > 1
    ]


@contextmanager
def _tarball(rootfs: Path) -> Iterator[Path]:
    """Write the tree as an uncompressed tarball next to it (numeric owners); delete it after."""
    handle, name = tempfile.mkstemp(suffix=".tar", dir=rootfs.parent)
    os.close(handle)
    try:
        tar = shutil.which("tar")
        if tar:
            argv = [tar, "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", name, "."]
            subprocess.run(argv, check=True, capture_output=True)
        else:
            with tarfile.open(name, "w", format=tarfile.PAX_FORMAT) as out:
                out.add(rootfs, arcname=".")
        yield Path(name)
    finally:
        os.unlink(name)


def find_mirror(roots: Iterable[Path] = (Path("/etc/apt"),)) -> str:
    """The host's Debian mirror (for bookworm, and so for every release), from its apt sources;
    the default one otherwise.

    Reads `sources.list` and `sources.list.d/*.list` (one-line format) and
    `sources.list.d/*.sources` (deb822); the first `deb` entry whose suites include `bookworm` wins.
    """
    for root in roots:
        files = [root / "sources.list"]
        files += sorted((root / "sources.list.d").glob("*.list"))
        files += sorted((root / "sources.list.d").glob("*.sources"))
        for path in files:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            parse = _deb822_entries if path.suffix == ".sources" else _one_line_entries
            for uri, suites in parse(text):
                if SUITE in suites and uri.startswith(("http://", "https://")):
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


def _one_line_entries(text: str) -> Iterator[tuple[str, list[str]]]:
    """(uri, [suite]) of each `deb [options] uri suite components...` line."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0]
        line = re.sub(r"\[[^\]]*\]", " ", line)  # drop [arch=... signed-by=...]
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "deb":
            yield fields[1], [fields[2]]


def _deb822_entries(text: str) -> Iterator[tuple[str, list[str]]]:
    """(uri, suites) of each enabled `Types: deb` stanza of a deb822 `.sources` file."""
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0].isspace() and key:  # continuation line
                fields[key] += " " + raw.strip()
                continue
            key, _, value = raw.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield uri, fields.get("suites", "").split()


# ---------------------------------------------------------------------------------------------
# static busybox image
# ---------------------------------------------------------------------------------------------


def build_busybox(tag: str = "orchard/busybox:static", *, force: bool = False, log: Log | None = None) -> str:
    """Build (or reuse) an image holding only a static busybox and its applets; return `tag`."""
    with closing(docker_client()) as client, _build_lock(tag):
        if force or _image_id(client, tag) is None:
            binary = static_busybox()
            import_rootfs(client, _busybox_tar(binary), tag, _changes(["/bin/sh"], "/bin"))
    return tag


def static_busybox(path: Path = BUSYBOX) -> Path:
    """The host's static busybox; ConfigError when it is missing or dynamically linked."""
    hint = "install the static one: `apt-get install busybox-static`"
    if not path.is_file():
        raise ConfigError(f"{path} is missing; {hint}")
    if elf_interpreter(path) is not None:
        raise ConfigError(f"{path} is dynamically linked; {hint}")
    return path


def _busybox_tar(binary: Path) -> bytes:
    """A root filesystem tarball: /bin/busybox, a link per applet, /tmp, /root and /etc."""
    applets = subprocess.run([str(binary), "--list"], check=True, capture_output=True, text=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777)):
            _add(tar, name, tarfile.DIRTYPE, mode)
        _add(tar, "bin/busybox", tarfile.REGTYPE, 0o755, binary.read_bytes())
        for applet in sorted(set(applets) - {"busybox"}):
            _add(tar, f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        _add(tar, "etc/passwd", tarfile.REGTYPE, 0o644, PASSWD)
        _add(tar, "etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\nnogroup:x:65534:\n")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
    """Add one root-owned entry to `tar`."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.size = len(data)
    info.mtime = MTIME
    tar.addfile(info, io.BytesIO(data) if data else None)


# ---------------------------------------------------------------------------------------------
# agent injector image (Kubernetes)
# ---------------------------------------------------------------------------------------------

AGENT_BUNDLE_LABEL = "org.orchard.agent-bundle"
"""The content hash of the bundle an injector image holds (its folder's name in the cache)."""
AGENT_FORMAT_LABEL = "org.orchard.agent-format"
AGENT_FORMAT = "1"
"""Bump when the injector image's layout changes, so older images are rebuilt."""
AGENT_BUNDLE_FOLDER = "/orchard-bundle"
INJECT_COMMAND = ["/bin/busybox", "cp", "-a", f"{AGENT_BUNDLE_FOLDER}/.", "/.orchard/"]
"""What the init container runs (and the image's default command): copy the bundle into the
volume mounted at `/.orchard`. Busybox is called by its path, so the image needs no applet link."""


def agent_tag() -> str:
    """The default tag of the injector image: `orchard/agent:<orchard version>`."""
    return f"orchard/agent:{__version__}"


def build_agent(
    tag: str | None = None, *, force: bool = False, bundle: Bundle | None = None, log: Log | None = None
) -> str:
    """Build (or reuse) the injector image of `bundle` (default: this host's, `build_bundle()`);
    return its tag, `agent_tag()` unless `tag` is given.

    An image already tagged so and labelled with the same bundle hash (and `AGENT_FORMAT`) is
    reused unless `force=True`: a changed agent, interpreter or bundle recipe rebuilds it.
    """
    tag = tag or agent_tag()
    bundle = bundle or build_bundle()
    key = bundle.path.name
    with closing(docker_client()) as client, _build_lock(tag):
        labels = _image_labels(client, tag)
        if not force and labels.get(AGENT_BUNDLE_LABEL) == key and labels.get(AGENT_FORMAT_LABEL) == AGENT_FORMAT:
            return tag
        changes = [
            *_changes(INJECT_COMMAND, "/bin"),
            f"LABEL {AGENT_BUNDLE_LABEL}={key} {AGENT_FORMAT_LABEL}={AGENT_FORMAT}",
        ]
        import_rootfs(client, _agent_tar(static_busybox(), bundle.path), tag, changes)
    return tag


def _agent_tar(binary: Path, bundle: Path) -> bytes:
    """A root filesystem tarball: /bin/busybox (with `sh` and `cp` links, for a person looking
    inside) and every file of `bundle` under `AGENT_BUNDLE_FOLDER`, root-owned, modes kept."""
    buffer = io.BytesIO()
    top = AGENT_BUNDLE_FOLDER.strip("/")
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "bin", tarfile.DIRTYPE, 0o755)
        _add(tar, "bin/busybox", tarfile.REGTYPE, 0o755, binary.read_bytes())
        for applet in ("cp", "sh"):
            _add(tar, f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox")
        _add(tar, top, tarfile.DIRTYPE, 0o755)
        for path in sorted(bundle.rglob("*")):
            name = f"{top}/{path.relative_to(bundle).as_posix()}"
            mode = path.stat().st_mode & 0o7777
            if path.is_dir() and not path.is_symlink():
                _add(tar, name, tarfile.DIRTYPE, mode)
            elif path.is_file() and not path.is_symlink():
                _add(tar, name, tarfile.REGTYPE, mode, path.read_bytes())
            else:  # the bundle holds real files only (bundle._copy); anything else is not ours
                raise ConfigError(f"{path} in the agent bundle is not a plain file: delete {bundle} and build again")
    return buffer.getvalue()


def quiet(_line: str) -> None:
    """A log that drops everything."""
