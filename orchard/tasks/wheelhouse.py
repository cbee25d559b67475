"""Dependencies resolved on the host for a task image's interpreter, into a wheelhouse the image
installs from with no network.

* **Resolution** (`resolve`) is the host's own pip (its index and configuration, as for any `pip
  install`) for the image's Python, ABI and platforms, wheels only, with the image's marker
  environment (`PIP_SHIM`). What a repository says it needs is untrusted input: every line must
  be a plain requirement (`name[extras] specifiers; marker`, `vetted`): no direct reference
  (`x @ file:...`, `git+...`, `-e ...`: pip would prepare their metadata, running their code, on
  the host), no option line (`--index-url`, `--no-binary`, `-r /path`). The repository's own
  metadata comes in as a wheel holding only that metadata (`project`), its names and versions
  checked. Nothing a repository names runs on the host.
* **Files** (`fetch`) are kept in a cache shared by every task (`settings().cache_dir / "wheels"`),
  by file name and checked by sha256 (one the index does not give is computed on download).
* **Source distributions** (`Wheelhouse`): a requirement with no wheel for the image has its sdist
  fetched without pip (`find_sdist`: the PEP 691/503 simple pages of the indexes pip is
  configured with, and its find-links folders; chosen by specifier and Requires-Python for the
  image's Python; sha256 checked), then built into a wheel in the base image itself, with no
  network (no compiler there: only pure-Python sources build). The one wheel of that name and
  version is kept under `built/<interpreter>`, a find-links folder of every later resolution.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import platform
import posixpath
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from orchard.config import settings
from orchard.env.images import quiet
from orchard.errors import ConfigError

Log = Callable[[str], None]

PIP_TIMEOUT_S = 1800
HTTP_TIMEOUT_S = 120
TOOLS = ("pip<25.3", "setuptools<81", "wheel")
"""What every venv gets first, as a conda env has them (the spec's pins come later): below the
releases that dropped what the environments SWE-bench's specs describe still had, pip's
`setup.py develop` fallback for editable installs of old projects (25.3) and setuptools'
`pkg_resources` (81)."""
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
"""pip's build requirements of a project whose `pyproject.toml` names none."""
NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
"""A distribution or extra name (PEP 508)."""
MAX_SOURCE_BUILDS = 8
"""Source distributions one resolution may build before giving up."""
PYPI = "https://pypi.org/simple"


class UnsafeRequirement(ConfigError):
    """A requirement line that is not a plain requirement: refused before pip sees it."""

    def __init__(self, line: str, reason: str, what: str = ""):
        super().__init__(f"{what + ': ' if what else ''}{line.strip()[:200]!r} {reason}")
        self.line = line


def vetted(line: str, what: str = "") -> Requirement:
    """`line` as a plain requirement (a trailing `# comment` dropped), or `UnsafeRequirement`."""
    text = re.sub(r"(^|\s)#.*$", "", line).strip()
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        raise UnsafeRequirement(line, "is not a plain requirement (name, extras, versions, marker)", what) from None
    if requirement.url is not None:
        raise UnsafeRequirement(line, "is a direct reference: pip would run its build on the host", what)
    return requirement


def split_vetted(lines: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the plain requirements of `lines`, the others), blank and comment lines dropped."""
    kept, refused = [], []
    for line in lines:
        if not re.sub(r"(^|\s)#.*$", "", line).strip():
            continue
        try:
            kept.append(str(vetted(line)))
        except UnsafeRequirement:
            refused.append(line.strip())
    return kept, refused


# ---------------------------------------------------------------------------------------------
# the target interpreter, pip for it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The interpreter and platform a wheelhouse is for: a base image's Python and glibc."""

    python: str
    """The full version of the image's Python (`3.9.2`)."""
    glibc: str
    machine: str = dataclasses.field(default_factory=platform.machine)
    before: str | None = None
    """Only what was uploaded before this moment (ISO 8601) is resolved (pip's `--uploaded-prior-to`),
    from indexes that say when (PyPI does); None: whatever is newest."""

    @property
    def version(self) -> str:
        return ".".join(self.python.split(".")[:2])

    def platforms(self) -> list[str]:
        """Every platform tag whose wheels run on this glibc, most specific first: pip does not
        widen `manylinux_2_X` by itself. `linux_*` is what a wheel built here is tagged."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        tags = [f"manylinux_{major}_{each}_{self.machine}" for each in range(minor, 4, -1)]
        aliases = (("2014", 17), ("2010", 12), ("1", 5)) if self.machine in ("x86_64", "i686") else (("2014", 17),)
        tags += [f"manylinux{alias}_{self.machine}" for alias, since in aliases if major == 2 and minor >= since]
        return [*tags, f"linux_{self.machine}"]

    def pip_options(self) -> list[str]:
        options = ["--python-version", self.version, "--implementation", "cp"]
        options += ["--abi", "cp" + self.version.replace(".", ""), "--only-binary=:all:"]
        for tag in self.platforms():
            options += ["--platform", tag]
        return options

    def describe(self) -> str:
        since = f", as uploaded before {self.before}" if self.before else ""
        return f"CPython {self.version} on manylinux (glibc {self.glibc}) {self.machine}{since}"


@dataclass(frozen=True)
class Wheel:
    """One distribution a resolution chose."""

    name: str
    version: str
    url: str
    sha256: str | None = None

    @property
    def filename(self) -> str:
        """The file's name: the URL's last path segment, unquoted, and a valid wheel name (so
        it cannot climb out of a folder it is joined to)."""
        name = posixpath.basename(unquote(urlsplit(self.url).path))
        try:
            parse_wheel_filename(name)
        except InvalidWheelFilename:
            raise ConfigError(f"the package index gave {self.url!r}, which is not a wheel's file name") from None
        if "/" in name or name.startswith("."):
            raise ConfigError(f"the package index gave {self.url!r}, which is not a wheel's file name")
        return name


PIP_SHIM = """\
import sys
import pip
from pip._vendor.packaging import markers
host, full = markers.default_environment, sys.argv.pop(1)
def target():
    env = host()
    env.update(python_full_version=full, implementation_version=full, python_version=".".join(full.split(".")[:2]))
    return env
markers.default_environment = target
if not markers.Marker(f'python_full_version == "{full}"').evaluate():
    sys.exit(f"orchard: pip {pip.__version__} no longer takes its marker environment from "
             "pip._vendor.packaging.markers.default_environment: pin pip to a release Orchard supports")
from pip._internal.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
"""pip with the target interpreter's marker environment: pip evaluates markers
(`importlib-metadata; python_version < "3.10"`) for the interpreter it runs on, whatever
`--python-version` says, so a 3.9 image would otherwise miss what only 3.9 needs. It replaces a
private function of pip's (the pip range in pyproject.toml is the one it is known to work with);
the canary fails loudly, naming pip's version, where that stops working."""


def _pip(target: Target, args: list[str], timeout: float = PIP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    if target.before:
        # pip's configuration files may name indexes that do not say when a file was uploaded (a
        # local folder): pip would take their newest files whatever the date. Its PIP_* variables
        # still apply.
        env["PIP_CONFIG_FILE"] = os.devnull
    try:
        return subprocess.run(
            [sys.executable, "-c", PIP_SHIM, target.python, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"pip took more than {timeout:g} s resolving dependencies") from None


# ---------------------------------------------------------------------------------------------
# resolving
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    """A repository's own metadata (as pip read it in its image), to resolve its dependencies."""

    name: str
    version: str
    requires_dist: tuple[str, ...] = ()
    requires_python: str | None = None
    provides_extra: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()
    """The extras to install (`pip install -e .[test]`)."""

    @classmethod
    def from_metadata(cls, metadata: Any, extras: Iterable[str], what: str) -> Project:
        """The checked fields of pip's `--report` metadata; ConfigError naming what is wrong."""
        if not isinstance(metadata, dict):
            raise ConfigError(f"{what}: pip gave no metadata for the repository")
        name, version = str(metadata.get("name", "")), str(metadata.get("version", ""))
        if not NAME.fullmatch(name):
            raise ConfigError(f"{what}: the repository's name {name[:80]!r} is not a distribution name")
        try:
            Version(version)
            python = metadata.get("requires_python")
            if python:
                SpecifierSet(str(python))
        except (InvalidVersion, InvalidSpecifier) as exc:
            raise ConfigError(f"{what}: the repository's metadata is invalid: {exc}") from None
        requires = []
        for line in metadata.get("requires_dist") or []:
            try:
                requires.append(str(vetted(str(line))))
            except UnsafeRequirement as exc:
                raise ConfigError(f"{what}: the repository's dependency {exc} (refused)") from None
        names = [str(each) for each in [*(metadata.get("provides_extra") or []), *extras]]
        bad = [each for each in names if not NAME.fullmatch(each)]
        if bad:
            raise ConfigError(f"{what}: {bad[0][:80]!r} is not an extra's name")
        return cls(
            name, version, tuple(requires), str(python) if python else None,
            tuple(str(e) for e in metadata.get("provides_extra") or []), tuple(extras),
        )  # fmt: skip

    def wheel(self, folder: Path) -> Path:
        """A wheel holding only this metadata, so the host's resolver takes its requirements,
        extras and markers as they are."""
        stem = f"{re.sub(r'[-_.]+', '_', self.name)}-{self.version}"
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if self.requires_python:
            lines.append(f"Requires-Python: {self.requires_python}")
        lines += [f"Provides-Extra: {extra}" for extra in self.provides_extra]
        lines += [f"Requires-Dist: {requirement}" for requirement in self.requires_dist]
        path = folder / f"{stem}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{stem}.dist-info/METADATA", "\n".join(lines) + "\n")
            archive.writestr(
                f"{stem}.dist-info/WHEEL",
                "Wheel-Version: 1.0\nGenerator: orchard\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            archive.writestr(f"{stem}.dist-info/RECORD", "")
        return path


def resolve(
    requirements: Iterable[str],
    target: Target,
    *,
    what: str,
    find_links: Iterable[Path] = (),
    project: Project | None = None,
    constraints: Iterable[str] = (),
) -> list[Wheel]:
    """The wheels that `requirements` (plain requirements: `vetted`, else `UnsafeRequirement`)
    and `project`'s dependencies resolve to for `target`, under `constraints` (plain `name==v`).

    The host's own pip resolves (`pip install --dry-run --report`, its index and configuration as
    for any `pip install`: `PIP_INDEX_URL`, `PIP_FIND_LINKS`, `PIP_NO_INDEX`, pip.conf) with
    `--python-version`, `--implementation cp`, `--abi cpXY`, every `--platform` the image's glibc
    runs, and `--only-binary=:all:` (pip resolves for another interpreter only from wheels: a source
    distribution's metadata comes from running its build on the interpreter at hand). A
    requirement with no wheel for `target` is a `MissingWheel` naming it (`Wheelhouse` then tries
    its source distribution). `project`'s own placeholder is left out of the answer."""
    lines = [str(vetted(line, what)) for line in requirements if line.strip()]
    pins = [str(vetted(line, what)) for line in constraints if line.strip()]
    with tempfile.TemporaryDirectory(prefix="orchard-resolve-") as tmp:
        placeholder = project.wheel(Path(tmp)) if project else None
        if placeholder is not None and project is not None:
            extras = f"[{','.join(project.extras)}]" if project.extras else ""
            lines.append(f"{project.name}{extras} @ {placeholder.as_uri()}")
        if not lines:
            return []
        listing, report, pinned = Path(tmp) / "requirements.txt", Path(tmp) / "report.json", Path(tmp) / "c.txt"
        listing.write_text("\n".join(lines) + "\n")
        pinned.write_text("\n".join(pins) + "\n")
        # Not --quiet: it hides which package has no distribution behind a ResolutionImpossible.
        args = ["install", "--dry-run", "--ignore-installed", "--report", str(report), "-c", str(pinned)]
        args += [*target.pip_options(), *(f"--find-links={folder}" for folder in find_links), "-r", str(listing)]
        args += ["--uploaded-prior-to", target.before] if target.before else []
        done = _pip(target, args)
        if done.returncode != 0 or not report.is_file():
            raise _pip_failure(done.stderr + done.stdout, what, target)
        try:
            items = json.loads(report.read_text())["install"]
            wheels = [
                Wheel(
                    str(item["metadata"]["name"]),
                    str(item["metadata"]["version"]),
                    str(item["download_info"]["url"]),
                    (item["download_info"].get("archive_info", {}).get("hashes") or {}).get("sha256"),
                )
                for item in items
            ]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(
                f"{what}: pip's resolution report is not what pip writes (pip {_pip_version()})"
            ) from None
    ours = placeholder.as_uri() if placeholder is not None else None
    return [wheel for wheel in wheels if wheel.url != ours and _checked(wheel)]


def _checked(wheel: Wheel) -> bool:
    """Whether `wheel` is the file it says it is (name and version of its file name)."""
    name, version, *_ = parse_wheel_filename(wheel.filename)
    if name != canonicalize_name(wheel.name) or version != Version(wheel.version):
        raise ConfigError(f"the package index gave {wheel.filename} for {wheel.name} {wheel.version}")
    return True


def _pip_version() -> str:
    from importlib.metadata import version

    return version("pip")


class MissingWheel(ConfigError):
    """No wheel of `requirement` for the target interpreter: it does not exist, or has only a
    source distribution (`Wheelhouse` then builds one)."""

    def __init__(self, message: str, requirement: str, what: str):
        super().__init__(message)
        self.requirement, self.what = requirement, what


class SourceBuildFailed(MissingWheel):
    """`requirement` has no wheel for the target, and its source distribution did not build there."""


def _pip_failure(output: str, what: str, target: Target) -> ConfigError:
    """Why pip could not resolve `what`, in one line naming the package when one is missing."""
    if "No module named pip" in output or "No module named 'pip" in output:
        return ConfigError("resolving dependencies needs pip in Orchard's own environment: install it there")
    canary = re.search(r"^orchard: pip .*$", output, re.M)
    if canary:
        return ConfigError(canary.group(0).removeprefix("orchard: "))
    missing = re.findall(r"No matching distribution found for (\S+)", output)
    if not missing and "no matching distributions available" in output:
        missing = re.findall(r"^\s+(\S+)\s*$", output.split("no matching distributions available")[-1], re.M)[:1]
    if missing:
        return MissingWheel(
            f"{what}: no distribution of {missing[-1]} for {target.describe()} in the package index "
            "(check its name and version, or add a wheel to a --find-links folder: PIP_FIND_LINKS)",
            missing[-1],
            what,
        )
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR")]
    reason = " | ".join(errors[-3:]) or (output.strip().splitlines() or ["pip failed"])[-1]
    return ConfigError(f"{what}: pip could not resolve the dependencies for {target.describe()}: {reason}")


# ---------------------------------------------------------------------------------------------
# files: the shared cache
# ---------------------------------------------------------------------------------------------


def fetch(wheels: Iterable[Wheel], folder: Path, target: Target, *, log: Log | None = None) -> None:
    """Put the files of `wheels` in `folder`, downloading only those the shared cache
    (`settings().cache_dir / "wheels"`) lacks; local files (a find-links folder) are copied. A
    cached file is used only when its sha256 is the index's; one the index gave no hash for is
    downloaded again."""
    say = log or quiet
    cache = settings().cache_dir / "wheels" / "files"
    cache.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    missing: list[Wheel] = []
    for wheel in {wheel.filename: wheel for wheel in wheels}.values():
        if wheel.url.startswith("file:"):
            local = Path(unquote(urlsplit(wheel.url).path))
            if wheel.sha256 is not None and _sha256(local) != wheel.sha256:
                raise ConfigError(f"{local} is not the file the package index described (sha256 differs)")
            _place(local, folder / wheel.filename)
        elif wheel.sha256 is not None and _sha256(cache / wheel.filename) == wheel.sha256:
            _place(cache / wheel.filename, folder / wheel.filename)
        else:
            missing.append(wheel)
    if not missing:
        return
    say(f"downloading {len(missing)} file(s) into {cache}")
    for batch in _one_version_each(missing):
        _download(batch, folder, cache, target)


def _one_version_each(wheels: list[Wheel]) -> list[list[Wheel]]:
    """`wheels` in batches that name each project once: a wheelhouse may hold two versions of one
    (what an early step installs and what a later one replaces it with), but pip refuses two
    versions of one project in one command."""
    batches: list[list[Wheel]] = []
    for wheel in wheels:
        name = canonicalize_name(wheel.name)
        batch = next((b for b in batches if all(canonicalize_name(w.name) != name for w in b)), None)
        if batch is None:
            batches.append(batch := [])
        batch.append(wheel)
    return batches


def _download(missing: list[Wheel], folder: Path, cache: Path, target: Target) -> None:
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        urls = [w.url + (f"#sha256={w.sha256}" if w.sha256 and "#" not in w.url else "") for w in missing]
        done = _pip(target, ["download", "--no-deps", "--quiet", "-d", tmp, *target.pip_options(), *urls])
        if done.returncode != 0:
            raise _pip_failure(done.stderr + done.stdout, "downloading wheels", target)
        for wheel in missing:
            downloaded = Path(tmp) / wheel.filename
            if _sha256(downloaded) is None or (wheel.sha256 and _sha256(downloaded) != wheel.sha256):
                raise ConfigError(f"downloading {wheel.filename} did not give the file the index described")
            os.replace(downloaded, cache / wheel.filename)  # atomic: a concurrent build sees all or none
            _place(cache / wheel.filename, folder / wheel.filename)


def _sha256(path: Path) -> str | None:
    """The sha256 of the file at `path`; None where there is none."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _place(source: Path, destination: Path) -> None:
    if destination.exists():
        return
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


# ---------------------------------------------------------------------------------------------
# source distributions, fetched without pip
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sdist:
    filename: str
    url: str
    version: Version
    sha256: str | None = None
    requires_python: str | None = None


def index_sources() -> tuple[list[str], list[str]]:
    """(index URLs, find-links) as the host's pip is configured (`pip config list`: its files,
    then PIP_* variables; `no-index` drops the indexes), PyPI unless an index-url is set."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
    )
    values: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, option = key.partition(".")
        if section in ("global", "download", "install", ":env:") and value:
            values[option.replace("_", "-")] = value.strip().strip("'\"")
    links = values.get("find-links", "").split()
    if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        return [], links
    return [values.get("index-url", PYPI), *values.get("extra-index-url", "").split()], links


class _Anchors(HTMLParser):
    """The links of a PEP 503 simple page: (href, data-requires-python, data-yanked)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str | None, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.links.append((str(found["href"]), found.get("data-requires-python"), "data-yanked" in found))


def _open(url: str) -> tuple[str, str]:
    """(content type, text) of `url` (file: or http(s):), asking for PEP 691 JSON first."""
    if url.startswith("file:"):
        path = Path(unquote(urlsplit(url).path))
        path = path / "index.html" if path.is_dir() else path
        return "text/html", path.read_text(errors="replace")
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=_ssl()) as answer:
        return answer.headers.get_content_type(), answer.read().decode(errors="replace")


def _ssl() -> ssl.SSLContext:
    cert = os.environ.get("PIP_CERT")
    return ssl.create_default_context(cafile=cert if cert and Path(cert).is_file() else None)


def _page_files(page: str) -> list[tuple[str, str | None, str | None]]:
    """(url, sha256, requires_python) of each file a simple page (JSON or HTML) links, yanked ones left out."""
    try:
        kind, text = _open(page)
    except (OSError, ValueError):
        return []
    found: list[tuple[str, str | None, str | None]] = []
    if kind == "application/vnd.pypi.simple.v1+json":
        with suppress(ValueError, TypeError, AttributeError):
            for item in json.loads(text).get("files") or []:
                if not item.get("yanked"):
                    url = urljoin(page, str(item["url"]))
                    found.append((url, (item.get("hashes") or {}).get("sha256"), item.get("requires-python")))
        return found
    anchors = _Anchors()
    anchors.feed(text)
    for href, python, yanked in anchors.links:
        if not yanked:
            url, _, fragment = urljoin(page, href).partition("#")
            sha = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
            found.append((url, sha, python))
    return found


def find_sdist(requirement: Requirement, target: Target) -> Sdist | None:
    """The newest source distribution of `requirement` for `target`'s Python in the indexes and
    find-links pip is configured with; None where there is none."""
    name = canonicalize_name(requirement.name)
    indexes, links = index_sources()
    files: list[tuple[str, str | None, str | None]] = []
    for index in indexes:
        files += _page_files(f"{index.rstrip('/')}/{name}/")
    for link in links:
        if "://" not in link and Path(link).is_dir():
            files += [(path.as_uri(), None, None) for path in sorted(Path(link).iterdir())]
        elif "://" in link:
            files += _page_files(link)
    python = Version(target.python)
    best: Sdist | None = None
    for url, sha, requires_python in files:
        filename = posixpath.basename(unquote(urlsplit(url).path))
        try:
            found, version = parse_sdist_filename(filename)
            allowed = requires_python is None or python in SpecifierSet(requires_python)
        except (InvalidSdistFilename, InvalidSpecifier):
            continue
        if found != name or not allowed or not requirement.specifier.contains(version, prereleases=None):
            continue
        if not url.startswith("file:") and sha is None:
            continue  # a remote file with no hash to check it by
        candidate = Sdist(filename, url, version, sha, requires_python)
        if best is None or (version, filename.endswith(".tar.gz")) > (best.version, best.filename.endswith(".tar.gz")):
            best = candidate
    return best


def download_sdist(sdist: Sdist, folder: Path) -> Path:
    """The file of `sdist` in `folder`, its sha256 checked where the index gave one."""
    path = folder / sdist.filename
    folder.mkdir(parents=True, exist_ok=True)
    if sdist.url.startswith("file:"):
        shutil.copyfile(unquote(urlsplit(sdist.url).path), path)
    else:
        with (
            urllib.request.urlopen(sdist.url, timeout=HTTP_TIMEOUT_S, context=_ssl()) as answer,
            path.open("wb") as out,
        ):
            shutil.copyfileobj(answer, out)
    if sdist.sha256 is not None and _sha256(path) != sdist.sha256:
        raise ConfigError(f"downloading {sdist.filename} did not give the file the index described (sha256 differs)")
    return path


def build_system_requires(pyproject: str | None) -> list[str]:
    """The `[build-system] requires` of a `pyproject.toml`'s text, or pip's default where it
    names none (or is not TOML, or its build-system is not a table)."""
    try:
        data = tomllib.loads(pyproject) if pyproject is not None else {}
    except tomllib.TOMLDecodeError:
        return list(LEGACY_BUILD_REQUIRES)
    system = data.get("build-system")
    requires = system.get("requires") if isinstance(system, dict) else None
    if not isinstance(requires, list):
        return list(LEGACY_BUILD_REQUIRES)
    return [str(each) for each in requires]


def _sdist_pyproject(sdist: Path) -> str | None:
    """The text of a source distribution's top-level `pyproject.toml` (read, not unpacked)."""
    import tarfile

    try:
        if sdist.suffix == ".zip":
            with zipfile.ZipFile(sdist) as archive:
                found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/pyproject.toml")]
                return archive.read(found[0]).decode() if found else None
        with tarfile.open(sdist) as archive:
            member = next((m for m in archive if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")), None)
            handle = archive.extractfile(member) if member is not None and member.isfile() else None
            return handle.read().decode() if handle is not None else None
    except (OSError, ValueError, tarfile.TarError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def venv_bootstrap(venv: str, wheels: str, tools: Iterable[Wheel]) -> str:
    """The shell that makes a venv at `venv` with the base image's Python and installs `tools`
    (pip among them) from the folder `wheels`, with pip run from its own wheel."""
    tools = list(tools)
    pip = next(wheel for wheel in tools if canonicalize_name(wheel.name) == "pip")
    pins = " ".join(f"{wheel.name}=={wheel.version}" for wheel in tools)
    return f"/usr/bin/python3 -m venv --without-pip {venv} && {venv}/bin/python {wheels}/{pip.filename}/pip install --quiet {pins}"


def docker_build(
    client: Any,
    context: Path,
    tag: str,
    fail: Callable[[str, str], Exception],
    labels: dict[str, str] | None = None,
    steps: list[tuple[str, float]] | None = None,
) -> str:
    """`docker build` of `context` (its Dockerfile) with no network; what it printed, or
    `fail(error, output)` raised. `steps` gets each instruction as it starts, with the time
    (`time.monotonic()`), and ("", time) when the build ends."""
    output: list[str] = []
    for chunk in client.api.build(
        path=str(context), tag=tag, network_mode="none", rm=True, forcerm=True, labels=labels or {}, decode=True
    ):
        text = chunk.get("stream", "")
        output.append(text)
        started = STEP.search(text)
        if started and steps is not None:
            steps.append((started.group(1).strip(), time.monotonic()))
        if "error" in chunk:
            raise fail(str(chunk["error"]), "".join(output))
    if steps is not None:
        steps.append(("", time.monotonic()))
    return "".join(output)


STEP = re.compile(r"^Step \d+/\d+ : (.*)$", re.M)
"""The line the engine's builder starts each instruction with."""


def plain(output: str) -> str:
    """Build output without the colour codes the engine wraps a step's stderr in."""
    return re.sub(r"\x1b\[[0-9;]*m", "", output)


def reason(output: str) -> str:
    """The telling lines of a failed pip run: the last exception and pip's `error:` line."""
    lines = [line.strip() for line in plain(output).splitlines() if line.strip()]
    telling = [line for line in lines if re.match(r"^(\w+(\.\w+)*(Error|Exception)\b|error:|ERROR:)", line)]
    return " | ".join((telling or lines)[-3:])


class Wheelhouse:
    """Resolution for one base image, with a fallback for what has no wheel for it: its source
    distribution (`find_sdist`, fetched without pip) built into a wheel in the base image itself,
    with no network, by the image's own Python (so it is right for that interpreter). Built wheels
    are kept under `settings().cache_dir / "wheels" / "built"` per interpreter, a find-links folder
    of every later resolution."""

    def __init__(self, client: Any, base: str, target: Target, log: Log):
        self.client, self.base, self.target, self.log = client, base, target, log
        key = f"{target.python}-glibc{target.glibc}-{target.machine}"
        self.built = settings().cache_dir / "wheels" / "built" / key

    def resolve(
        self, requirements: Iterable[str], *, what: str, depth: int = 0, project: Project | None = None,
        constraints: Iterable[str] = (),
    ) -> list[Wheel]:  # fmt: skip
        lines, pins = list(requirements), list(constraints)
        tried: set[str] = set()
        while True:
            self.built.mkdir(parents=True, exist_ok=True)
            try:
                return resolve(
                    lines, self.target, what=what, find_links=[self.built], project=project, constraints=pins
                )
            except MissingWheel as exc:
                if exc.requirement in tried or len(tried) >= MAX_SOURCE_BUILDS or depth > 1:
                    raise
                tried.add(exc.requirement)
                self._build_from_source(exc, depth)

    def _build_from_source(self, missing: MissingWheel, depth: int) -> None:
        """Build `missing.requirement` from its source distribution into `self.built`; re-raise
        `missing` when it has none, `SourceBuildFailed` when it does not build."""
        import docker.errors

        target = self.target
        try:
            requirement = Requirement(missing.requirement)
        except InvalidRequirement:
            raise missing from None
        found = find_sdist(requirement, target)
        if found is None:
            raise missing
        with tempfile.TemporaryDirectory(prefix="orchard-sdist-") as tmp:
            context = Path(tmp)
            sdist = download_sdist(found, context / "sdist")
            self.log(f"{missing.requirement}: no wheel for {target.describe()}; building {sdist.name} in {self.base}")
            what = f"building {sdist.name}"
            tools = self.resolve(TOOLS, what=what, depth=depth + 1)
            backend = self.resolve(build_system_requires(_sdist_pyproject(sdist)), what=what, depth=depth + 1)
            fetch([*tools, *backend], context / "wheels", target, log=self.log)
            (context / "Dockerfile").write_text(
                f"FROM {self.base}\nCOPY wheels /w\nCOPY sdist /s\n"
                "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/w PIP_DISABLE_PIP_VERSION_CHECK=1\n"
                f"RUN {venv_bootstrap('/v', '/w', tools)} && /v/bin/python -m pip wheel --no-deps -w /out /s/{sdist.name}\n"
            )

            def failed(error: str, output: str) -> Exception:
                return SourceBuildFailed(
                    f"{missing.what}: {missing.requirement} has no wheel for {target.describe()}, and building "
                    f"its source distribution {sdist.name} in {self.base} failed (the base images have no C "
                    f"compiler): {reason(output) or error.strip()}",
                    missing.requirement,
                    missing.what,
                )

            tag = f"orchard/wheel-build:{hashlib.sha256(str(context).encode()).hexdigest()[:16]}"
            docker_build(self.client, context, tag, failed)
            try:
                self._take_wheel(tag, sdist.name, failed)
            finally:
                with suppress(docker.errors.APIError):
                    self.client.images.remove(tag)

    def _take_wheel(self, image: str, sdist: str, failed: Callable[[str, str], Exception]) -> None:
        """Copy the one wheel of `sdist`'s name and version that the build left in `/out` of
        `image` into `self.built` (read as base64 from a container: no archive from a container
        that ran third-party code is unpacked); anything else there is a failed build."""
        name, version = parse_sdist_filename(sdist)
        names = self.client.containers.run(image, ["ls", "/out"], network_mode="none", remove=True).decode().split()
        wheels = []
        for each in names:
            with suppress(InvalidWheelFilename):
                if parse_wheel_filename(each)[:2] == (name, version) and "/" not in each:
                    wheels.append(each)
        if len(wheels) != 1 or len(names) != 1:
            raise failed("", f"it left {', '.join(names) or 'nothing'} in /out, not one wheel of {name} {version}")
        (wheel,) = wheels
        text = self.client.containers.run(image, ["base64", f"/out/{wheel}"], network_mode="none", remove=True)
        try:
            data = base64.b64decode(text, validate=False)
        except ValueError:
            raise failed("", f"its wheel {wheel} could not be read back from the image") from None
        partial = self.built / f".{wheel}.partial"
        partial.write_bytes(data)  # a container's log is text: binary is mangled
        os.replace(partial, self.built / wheel)
        self.log(f"built {wheel}")


def venv_image(
    client: Any,
    base: str,
    tag: str,
    requirements: Iterable[str],
    *,
    what: str,
    venv: str = "/opt/orchard/venv",
    labels: dict[str, str] | None = None,
    log: Log | None = None,
) -> str:
    """Build `tag`: `base` (an image of `orchard.env.images.build_base`, whose labels say its Python
    and glibc) with a venv at `venv`, first on PATH, holding `requirements` (plain requirements)
    and what they need, resolved on the host into a wheelhouse (`Wheelhouse`: files from the
    shared cache) and installed by `docker build` with no network. Returns the tag. The caller
    decides when to build (and holds `orchard.env.images.build_lock(tag)`)."""
    from orchard.env import images

    say = log or quiet
    facts = images.base_facts(dict(client.images.get(base).labels or {}))
    if facts is None:
        raise ConfigError(f"base image {base} does not say its Python and glibc versions: rebuild it with --force")
    house = Wheelhouse(client, base, Target(*facts), say)
    tools = house.resolve(TOOLS, what=f"{what}: {', '.join(TOOLS)}")
    wheels = house.resolve(requirements, what=what)
    wheelhouse = f"{posixpath.dirname(venv)}/wheels"
    with tempfile.TemporaryDirectory(prefix="orchard-venv-image-") as tmp:
        context = Path(tmp)
        fetch([*tools, *wheels], context / "wheels", house.target, log=say)
        pins = " ".join(f"{wheel.name}=={wheel.version}" for wheel in wheels)
        (context / "Dockerfile").write_text(
            f"FROM {base}\nCOPY wheels {wheelhouse}\n"
            f"ENV VIRTUAL_ENV={venv} PATH={venv}/bin:{images.SEARCH_PATH} PIP_NO_INDEX=1 PIP_FIND_LINKS={wheelhouse}"
            " PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1\n"
            f"RUN {venv_bootstrap(venv, wheelhouse, tools)} && {venv}/bin/python -m pip install --quiet {pins}\n"
        )

        def failed(error: str, output: str) -> Exception:
            return ConfigError(f"{what}: building {tag} failed: {reason(output) or error.strip()}")

        say(f"building {tag} from {base} ({len(wheels)} distributions)")
        docker_build(client, context, tag, failed, labels)
    return tag
