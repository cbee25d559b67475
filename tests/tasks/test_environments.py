"""Task environments: which base image and Python, dependencies resolved on the host into a
wheelhouse, images installed from it with no network, and SWE-bench's prebuilt layout.

Everything runs offline: the package index is a local folder built here (`PIP_NO_INDEX=1`,
`PIP_FIND_LINKS`), holding tiny wheels made by this file and real pip, setuptools and wheel
repacked from this interpreter's own installs. Tasks of a repository SWE-bench has no spec for
get one registered in the `swebench` package's own table, so the real spec path is what runs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import re
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchard.errors import ConfigError, ImageNotFound
from orchard.recipes.swe import environments, specs
from orchard.recipes.swe.environments import (
    choose_release,
    conda_requirement,
    environment_yml_requirements,
    image_warnings,
    merged_requirements,
    swebench_image_name,
    task_image,
)
from orchard.recipes.swe.task import SWETask
from orchard.tasks import repos, wheelhouse
from orchard.tasks.repos import RepoMirror
from orchard.tasks.wheelhouse import (
    MissingWheel,
    Project,
    SourceBuildFailed,
    Target,
    UnsafeRequirement,
    Wheel,
    Wheelhouse,
    resolve,
)

HOST_MARK = "setup-py-ran-on-the-host"
BOOKWORM = Target("3.11.2", "2.36")
BULLSEYE = Target("3.9.2", "2.31")
REPO = "orchard-test/envdemo"


# ---------------------------------------------------------------------------------------------
# a local package index
# ---------------------------------------------------------------------------------------------


def _write_wheel(folder: Path, name: str, version: str, files: dict[str, str], metadata: list[str] = ()) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    body = {
        **files,
        f"{info}/METADATA": "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *metadata])
        + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={hashlib.sha256(text.encode()).hexdigest()},{len(text)}" for path, text in body.items()]
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, text in body.items():
            archive.writestr(name_in, text)
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def _repack(distribution: str, folder: Path) -> Path:
    """A wheel of an installed distribution, made from its files (pip, setuptools and wheel are
    pure Python: their installed tree is their wheel's content, console scripts aside)."""
    dist = importlib.metadata.distribution(distribution)
    root = Path(dist.locate_file(""))
    name, version = dist.metadata["Name"], dist.version
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in dist.files or []:
            text = str(file)
            if text.startswith("..") or "__pycache__" in text or text.endswith(("RECORD", "INSTALLER", "REQUESTED")):
                continue
            archive.write(root / file, text)
        info = next(str(f).split("/")[0] for f in dist.files or [] if ".dist-info/" in str(f))
        archive.writestr(f"{info}/RECORD", "")
    return path


def _write_sdist(folder: Path, name: str, setup: str, files: dict[str, str]) -> Path:
    stem = f"{name.replace('-', '_')}-1.0"
    path = folder / f"{stem}.tar.gz"
    body = {"setup.py": setup, "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", **files}
    with tarfile.open(path, "w:gz") as archive:
        for name_in, text in body.items():
            info = tarfile.TarInfo(f"{stem}/{name_in}")
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """A find-links folder: pip, setuptools, wheel, pytest (and what they need), and the
    envdemo project's dependencies."""
    folder = tmp_path_factory.mktemp("index")
    for each in ("pip", "setuptools", "wheel", "packaging", "pytest", "pluggy", "iniconfig", "pygments"):
        _repack(each, folder)
    _write_wheel(
        folder, "orchard-envdemo-dep", "1.0", {"orchard_envdemo_dep.py": "VALUE = 41\n"},
        ['Requires-Dist: orchard-envdemo-old; python_version < "3.10"'],
    )  # fmt: skip
    _write_wheel(folder, "orchard-envdemo-old", "1.0", {"orchard_envdemo_old.py": ""})
    _write_wheel(folder, "orchard-envdemo-req", "2.0", {"orchard_envdemo_req.py": ""})
    _write_wheel(folder, "orchard-envdemo-pin", "1.0", {"orchard_envdemo_pin.py": "PIN = 1\n"})
    _write_wheel(folder, "orchard-envdemo-pin", "2.0", {"orchard_envdemo_pin.py": "PIN = 2\n"})
    _write_wheel(folder, "orchard-envdemo-extra", "1.0", {"orchard_envdemo_extra.py": ""})
    _write_sdist(  # pure Python, source only: built in the base image; it leaves a mark where it ran
        folder, "orchard-envdemo-pure",
        f'import os\nos.path.isdir({str(folder)!r}) and open({str(folder / HOST_MARK)!r}, "w").close()\n'
        'from setuptools import setup\nsetup(name="orchard-envdemo-pure", version="1.0", '
        'py_modules=["orchard_envdemo_pure"], install_requires=["orchard-envdemo-old"])\n',
        {"orchard_envdemo_pure.py": "PURE = True\n"},
    )  # fmt: skip
    _write_sdist(  # its build leaves a second wheel, of another project, in pip's output folder
        folder, "orchard-envdemo-poison",
        'import os\nos.makedirs("/out", exist_ok=True)\n'
        'open("/out/orchard_envdemo_evil-1.0-py3-none-any.whl", "w").write("x")\n'
        'from setuptools import setup\nsetup(name="orchard-envdemo-poison", version="1.0", py_modules=[])\n',
        {},
    )  # fmt: skip
    _write_sdist(  # a C extension, source only: the base images have no compiler
        folder, "orchard-envdemo-cext",
        'from setuptools import Extension, setup\nsetup(name="orchard-envdemo-cext", version="1.0", '
        'ext_modules=[Extension("orchard_envdemo_cext", ["cext.c"])])\n',
        {"cext.c": "#include <Python.h>\n"},
    )  # fmt: skip
    return folder


@pytest.fixture
def offline(index: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip on this host sees only `index` (no network, no pip.conf). Its pip and setuptools are
    this interpreter's, newer than the caps of `TOOLS`, which are lifted."""
    monkeypatch.setattr(environments, "TOOLS", ("pip", "setuptools", "wheel"))
    monkeypatch.setattr(wheelhouse, "TOOLS", ("pip", "setuptools", "wheel"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return index


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00"}
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "envdemo"
version = "0.1"
dependencies = ["orchard-envdemo-dep"]

[project.optional-dependencies]
test = ["orchard-envdemo-extra"]

[tool.setuptools]
packages = ["envdemo"]
"""


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[Path, str, str]:
    """A mirror holding `orchard-test/envdemo`: (folder, environment_setup_commit, base_commit).
    The requirements differ between the two commits, so a build shows which one it read."""
    root = tmp_path_factory.mktemp("mirror")
    repo = root / "orchard-test" / "envdemo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    setup = _commit(
        repo,
        {
            "pyproject.toml": PYPROJECT,
            "envdemo/__init__.py": "from orchard_envdemo_dep import VALUE\n",
            "tests/test_envdemo.py": "import envdemo\n\ndef test_value():\n    assert envdemo.VALUE + 1 == 42\n",
            "requirements/test.txt": "# tests\n-r base.txt\n-e .\norchard-envdemo-req==2.0\n",
            "requirements/base.txt": "orchard-envdemo-pin\norchard-envdemo-cext\n",
        },
        "setup",
    )
    base = _commit(repo, {"requirements/test.txt": "orchard-envdemo-req==9.9\n"}, "base")
    return root, setup, base


@pytest.fixture
def envdemo_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWE-bench's spec table gains `orchard-test/envdemo` 0.1, as if the package shipped it."""
    constants = specs._python_constants()
    spec = {
        "python": "3.11",
        "packages": "requirements.txt",
        "pip_packages": ["orchard-envdemo-pin==1.0", "pytest"],
        "pre_install": [
            "apt-get update && apt-get install -y locales",  # needs the network: skipped
            "locale-gen en_US.UTF-8",  # needs what apt-get would have installed: fails, recorded
            "echo ran > /tmp/pre_install_ran",
            # as sphinx 3.x's rewrite of its setup.py: the repository now asks for a newer pin
            """sed -i 's/"orchard-envdemo-dep"]/"orchard-envdemo-dep", "orchard-envdemo-pin>=2"]/' pyproject.toml""",
        ],
        "install": "python -m pip install -e .[test]",
        "test_cmd": "pytest -rA",
    }
    monkeypatch.setitem(constants.MAP_REPO_VERSION_TO_SPECS_PY, REPO, {"0.1": spec})
    monkeypatch.setitem(constants.MAP_REPO_TO_REQS_PATHS, REPO, ["requirements/test.txt"])


def _task(setup: str, base: str, **fields) -> SWETask:
    row = {
        "instance_id": "orchard-test__envdemo-1",
        "repo": REPO,
        "base_commit": base,
        "environment_setup_commit": setup,
        "version": "0.1",
        "problem_statement": "x",
        "FAIL_TO_PASS": '["tests/test_envdemo.py::test_value"]',
        **fields,
    }
    return SWETask.model_validate(row)


# ---------------------------------------------------------------------------------------------
# without an engine
# ---------------------------------------------------------------------------------------------


def test_pythons_map_to_releases_and_the_rest_to_the_nearest_with_a_warning() -> None:
    assert choose_release(None) == ("bookworm", None)
    assert choose_release("3.9") == ("bullseye", None)
    assert choose_release("3.13") == ("trixie", None)
    for wanted, release, offered in (
        ("3.6", "bullseye", "3.9"),
        ("3.10", "bullseye", "3.9"),
        ("3.12", "bookworm", "3.11"),
    ):
        chosen, warning = choose_release(wanted)
        assert chosen == release
        assert warning is not None and f"wants Python {wanted}" in warning and f"runs on Python {offered}" in warning


def test_requirements_are_merged_as_swebench_merges_them(mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against SWE-bench's own `get_requirements`, whose HTTP fetches of GitHub's raw files are
    answered from the local repository (a stand-in for raw.githubusercontent.com: same paths,
    200 or 404, nothing else)."""
    from swebench.harness.test_spec import python as swebench_python

    root, setup, base = mirror
    repo = root / REPO

    class Answer:
        def __init__(self, text: str | None):
            self.status_code, self.text = (200, text) if text is not None else (404, "")

    def get(url: str, headers=None):
        commit, _, path = url.split(f"{REPO}/", 1)[1].partition("/")
        return Answer(repos.show(repo, commit, path))

    monkeypatch.setattr(swebench_python.requests, "get", get)
    monkeypatch.setitem(specs._python_constants().MAP_REPO_TO_REQS_PATHS, REPO, ["requirements/test.txt"])
    monkeypatch.setattr(swebench_python, "MAP_REPO_TO_REQS_PATHS", specs._python_constants().MAP_REPO_TO_REQS_PATHS)
    theirs = swebench_python.get_requirements({"repo": REPO, "base_commit": base, "environment_setup_commit": setup})
    ours = merged_requirements(lambda path: repos.show(repo, setup, path), ["requirements/test.txt"])
    assert ours == (theirs, "requirements/test.txt")
    assert ours[0].split("\n") == ["orchard-envdemo-pin", "orchard-envdemo-cext", "", "orchard-envdemo-req==2.0", ""]
    assert merged_requirements(lambda path: None, ["a.txt", "b.txt"]) is None
    replaced = merged_requirements(lambda path: "types-pkg_resources==0.1.3\nx\n", ["r.txt"])
    assert replaced is not None and replaced[0].split("\n")[0] == "types-setuptools"


def test_resolution_takes_markers_for_the_images_python(offline: Path) -> None:
    """The host runs 3.11; a 3.9 image needs what `python_version < "3.10"` adds."""
    for target, expected in (
        (BULLSEYE, {"orchard-envdemo-dep", "orchard-envdemo-old"}),
        (BOOKWORM, {"orchard-envdemo-dep"}),
    ):
        wheels = resolve(["orchard-envdemo-dep"], target, what="test")
        assert {wheel.name for wheel in wheels} == expected
        assert all(wheel.url.startswith("file:") and wheel.filename.endswith(".whl") for wheel in wheels)


def test_a_missing_dependency_is_one_line_naming_it(offline: Path) -> None:
    with pytest.raises(MissingWheel) as caught:
        resolve(["orchard-envdemo-dep", "orchard-no-such-package==1.0"], BOOKWORM, what="task t: requirements")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("task t: requirements: ")
    assert "orchard-no-such-package==1.0" in message and "CPython 3.11" in message
    assert caught.value.requirement == "orchard-no-such-package==1.0"


def test_build_output_naming_a_missing_package_is_one_line() -> None:
    output = ["Step 5/9 : RUN python -m pip install x\n", "ERROR: No matching distribution found for orchard-gone==2\n"]
    message = environments._build_failure("The command returned a non-zero code: 1", output)
    assert "\n" not in message and message.startswith("orchard-gone==2 is not in the image's wheelhouse")


def test_a_failed_install_names_its_step() -> None:
    steps = {"RUN python -m pip install 'Jinja2==3.0.3'": "pip_packages"}
    output = "Step 3/9 : COPY wheels /w\nStep 4/9 : RUN python -m pip install 'Jinja2==3.0.3'\nERROR: boom\n"
    assert environments._failed_step(output, steps) == " at pip_packages (`python -m pip install 'Jinja2==3.0.3'`)"
    assert environments._failed_step("Step 3/9 : COPY wheels /w\n", steps) == ""


def test_the_repository_s_install_replaces_what_it_excludes_as_pip_does() -> None:
    """sphinx 3.4's spec: `pip_packages` install Jinja2 3.0.3, then `pre_install` makes setup.py
    ask for Jinja2<3.0 and markupsafe<=2.0.1; pip, installing the repository, replaces both (a
    later step wins, as in SWE-bench's harness) and keeps what it does not exclude."""
    project = Project(
        "Sphinx", "3.4.0",
        ("Jinja2<3.0", "markupsafe<=2.0.1", "docutils>=0.12", "pytest; extra == 'test'",
         "typed-ast; python_version < '3.8' and extra == 'test'", "colorama>=0.3.5; sys_platform == 'win32'"),
        provides_extra=("test",), extras=("test",),
    )  # fmt: skip
    pins = ["Jinja2==3.0.3", "MarkupSafe==2.1.5", "docutils==0.17.1", "pytest==8.0.0", "typed-ast==1.0", "tox==4.16.0"]
    assert environments.superseded(pins, project, "3.9.2") == {
        "Jinja2==3.0.3": "Jinja2<3.0",
        "MarkupSafe==2.1.5": "markupsafe<=2.0.1",
    }
    older = Project("x", "1", ("pytest<8; extra == 'test'",), provides_extra=("test",))  # not installed with [test]
    assert environments.superseded(["pytest==8.0.0"], older, "3.9.2") == {}


def test_extras_and_build_requirements_are_read_as_pip_reads_them(tmp_path: Path) -> None:
    assert environments.install_extras(["python -m pip install -e .[test,dev] --verbose"]) == ["test", "dev"]
    assert environments.install_extras(["python -m pip install -e '.[all]'", "pip install ."]) == ["all"]
    assert environments.build_requirements(tmp_path) == ["setuptools>=40.8.0", "wheel"]
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["flit_core>=3.4"]\n')
    assert environments.build_requirements(tmp_path) == ["flit_core>=3.4"]


def test_the_swebench_image_name_is_the_packages_own() -> None:
    from swebench.harness.test_spec.test_spec import make_test_spec

    rows = Path(__file__).with_name("data").joinpath("swe-bench-lite-7.jsonl").read_text().splitlines()
    row = next(r for r in map(json.loads, rows) if r["repo"] == "pytest-dev/pytest")  # its spec fetches nothing
    task = SWETask.model_validate(row)
    assert swebench_image_name(task) == make_test_spec(row, namespace="swebench").instance_image_key
    assert swebench_image_name(task) == f"swebench/sweb.eval.x86_64.{row['instance_id'].replace('__', '_1776_')}:latest"


def test_nothing_a_repository_names_reaches_the_hosts_pip_unless_it_is_a_plain_requirement(
    offline: Path, tmp_path: Path
) -> None:
    """Direct references make pip prepare their metadata on the host (running their setup.py),
    option lines change the host's pip or read its files: all are refused before pip runs."""
    project = tmp_path / "evil"
    project.mkdir()
    mark = tmp_path / "ran"
    (project / "setup.py").write_text(f"open({str(mark)!r}, 'w').close()\nfrom setuptools import setup\nsetup()\n")
    for line in (
        f"evil @ {project.as_uri()}",
        f"-e {project}",
        str(project),
        "git+https://127.0.0.1:9/evil.git",
        "evil @ https://127.0.0.1:9/evil-1.0.tar.gz",
        "--no-binary orchard-envdemo-dep",
        "--index-url http://127.0.0.1:9/simple",
        "--extra-index-url http://127.0.0.1:9/simple",
        "--trusted-host 127.0.0.1",
        f"-f {tmp_path}",
        "-r /etc/passwd",
        "-c /etc/passwd",
        "orchard-envdemo-dep\n--index-url http://127.0.0.1:9/simple",
    ):
        with pytest.raises(UnsafeRequirement, match=r"^task t: requirements: '.*' is (not a plain|a direct)"):
            resolve(["orchard-envdemo-dep", line], BOOKWORM, what="task t: requirements")
        assert wheelhouse.split_vetted(["orchard-envdemo-dep  # ours", line]) == (
            ["orchard-envdemo-dep"],
            [line.strip()],
        )
        with pytest.raises(UnsafeRequirement):
            resolve([], BOOKWORM, what="test", constraints=[line])
    assert not mark.exists()


def test_a_repositorys_metadata_is_checked_before_it_becomes_a_requirement(offline: Path) -> None:
    good = {"name": "envdemo", "version": "0.1", "requires_dist": ["orchard-envdemo-dep"], "provides_extra": ["test"]}
    project = Project.from_metadata(good, ["test"], "t")
    assert {wheel.name for wheel in resolve([], BOOKWORM, what="t", project=project)} == {"orchard-envdemo-dep"}
    for bad, message in (
        ({**good, "name": "envdemo\n--index-url http://127.0.0.1:9/"}, "not a distribution name"),
        ({**good, "version": "0.1\nRequires-Dist: x"}, "metadata is invalid"),
        ({**good, "requires_python": ">=3\nRequires-Dist: x"}, "metadata is invalid"),
        ({**good, "requires_dist": ["x @ file:///tmp/x"]}, "direct reference"),
        ({"version": "1"}, "not a distribution name"),
        ([], "no metadata"),
    ):
        with pytest.raises(ConfigError, match=message):
            Project.from_metadata(bad, [], "t")
    with pytest.raises(ConfigError, match="not an extra's name"):
        Project.from_metadata(good, ["test]\n--no-index"], "t")


def test_wheel_file_names_cannot_leave_their_folder() -> None:
    assert Wheel("x", "1.0", "https://h/p/x-1.0-py3-none-any.whl").filename == "x-1.0-py3-none-any.whl"
    assert Wheel("x", "1.0", "https://h/p/..%2F..%2Fx-1.0-py3-none-any.whl").filename == "x-1.0-py3-none-any.whl"
    for url in ("https://h/p/x.whl", "https://h/p/..%2F", "https://h/p/..%2F..%2F.whl"):
        with pytest.raises(ConfigError, match="not a wheel's file name"):
            Wheel("x", "1.0", url).filename  # noqa: B018


def test_the_shared_cache_is_trusted_only_by_sha256(index: Path, tmp_path: Path, monkeypatch) -> None:
    """A file in the cache with a wheel's name but other bytes is downloaded again, with a hash or
    without one (served by a real HTTP server on loopback)."""
    import functools
    import http.server
    import threading

    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    real = index / "orchard_envdemo_pin-1.0-py3-none-any.whl"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{real.name}"
        sha = hashlib.sha256(real.read_bytes()).hexdigest()
        for i, wheel in enumerate(
            (Wheel("orchard-envdemo-pin", "1.0", url, sha), Wheel("orchard-envdemo-pin", "1.0", url))
        ):
            cached = tmp_path / "cache" / "wheels" / "files" / real.name
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(b"poisoned")
            wheelhouse.fetch([wheel], tmp_path / f"out{i}", BOOKWORM)
            assert (tmp_path / f"out{i}" / real.name).read_bytes() == real.read_bytes()
    finally:
        server.shutdown()


@contextmanager
def json_index(name: str, page: dict, files: dict[str, bytes]) -> Iterator[str]:
    """A package index on loopback speaking PEP 691 JSON: `page` as project `name`'s page, `files`
    (read as it is asked, so a test may change it) by path; its simple URL."""
    import http.server
    import threading

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(page).encode() if self.path == f"/simple/{name}/" else files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def test_source_distributions_are_found_without_pip(index: Path, tmp_path: Path, monkeypatch) -> None:
    """The index's PEP 691 JSON page (a real HTTP server on loopback), chosen by specifier and by
    Requires-Python for the image's Python, its sha256 checked; and a find-links folder."""

    from packaging.requirements import Requirement

    good, newer = b"good sdist", b"needs 3.10"
    files = {"/files/orchard_envdemo_x-1.0.tar.gz": good, "/files/orchard_envdemo_x-2.0.tar.gz": newer}
    page = {
        "meta": {"api-version": "1.0"},
        "name": "orchard-envdemo-x",
        "files": [
            {"filename": "orchard_envdemo_x-1.0.tar.gz", "url": "../../files/orchard_envdemo_x-1.0.tar.gz",
             "hashes": {"sha256": hashlib.sha256(good).hexdigest()}},
            {"filename": "orchard_envdemo_x-2.0.tar.gz", "url": "../../files/orchard_envdemo_x-2.0.tar.gz",
             "hashes": {"sha256": hashlib.sha256(newer).hexdigest()}, "requires-python": ">=3.10"},
            {"filename": "orchard_envdemo_x-1.5.tar.gz", "url": "../../files/orchard_envdemo_x-1.5.tar.gz",
             "hashes": {}},  # no hash to check it by: not taken
        ],
    }  # fmt: skip

    with json_index("orchard-envdemo-x", page, files) as url:
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.delenv("PIP_NO_INDEX", raising=False)
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
        monkeypatch.setenv("PIP_INDEX_URL", url)
        found = wheelhouse.find_sdist(Requirement("orchard-envdemo-x"), BULLSEYE)
        assert found is not None and found.filename == "orchard_envdemo_x-1.0.tar.gz"
        assert wheelhouse.download_sdist(found, tmp_path / "a").read_bytes() == good
        assert wheelhouse.find_sdist(Requirement("orchard-envdemo-x"), BOOKWORM).filename.endswith("2.0.tar.gz")
        assert wheelhouse.find_sdist(Requirement("orchard-envdemo-x<1"), BOOKWORM) is None
        files["/files/orchard_envdemo_x-1.0.tar.gz"] = b"tampered"
        with pytest.raises(ConfigError, match="sha256 differs"):
            wheelhouse.download_sdist(found, tmp_path / "b")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    found = wheelhouse.find_sdist(Requirement("orchard_envdemo.pure"), BOOKWORM)
    assert found is not None and found.url == (index / "orchard_envdemo_pure-1.0.tar.gz").as_uri()


def test_resolution_as_of_a_date_takes_what_was_uploaded_before_it(index: Path, tmp_path: Path, monkeypatch) -> None:
    """A PEP 691 JSON index on loopback that says when each file was uploaded: as of a date, the
    older version is taken, even with a pip.conf naming a folder that holds the newer one with no
    date (configuration files are left out of dated resolutions). Both versions are then fetched
    in one call, as a wheelhouse holding an early step's version and its replacement does."""

    names = {"1.0": "2024-05-01T00:00:00Z", "2.0": "2025-06-01T00:00:00Z"}
    files = {
        f"/files/orchard_envdemo_pin-{v}-py3-none-any.whl": (
            index / f"orchard_envdemo_pin-{v}-py3-none-any.whl"
        ).read_bytes()
        for v in names
    }
    page = {
        "meta": {"api-version": "1.1"},
        "name": "orchard-envdemo-pin",
        "versions": list(names),
        "files": [
            {"filename": path.rpartition("/")[2], "url": f"../..{path}", "upload-time": names[path.split("-")[1]],
             "hashes": {"sha256": hashlib.sha256(body).hexdigest()}}
            for path, body in files.items()
        ],
    }  # fmt: skip

    with json_index("orchard-envdemo-pin", page, files) as url:
        newest_only = tmp_path / "links"
        newest_only.mkdir()
        (newest_only / "orchard_envdemo_pin-2.0-py3-none-any.whl").write_bytes(
            files["/files/orchard_envdemo_pin-2.0-py3-none-any.whl"]
        )
        (tmp_path / "pip.conf").write_text(f"[global]\nfind-links = {newest_only}\n")
        monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
        monkeypatch.delenv("PIP_NO_INDEX", raising=False)
        monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
        monkeypatch.setenv("PIP_INDEX_URL", url)
        monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
        dated = Target("3.11.2", "2.36", before="2025-01-01T00:00:00Z")
        (old,) = resolve(["orchard-envdemo-pin"], dated, what="test")
        (new,) = resolve(["orchard-envdemo-pin"], BOOKWORM, what="test")
        assert (old.version, new.version) == ("1.0", "2.0")
        wheelhouse.fetch([old, new], tmp_path / "house", dated)
        assert sorted(p.name for p in (tmp_path / "house").iterdir()) == [
            "orchard_envdemo_pin-1.0-py3-none-any.whl",
            "orchard_envdemo_pin-2.0-py3-none-any.whl",
        ]


def test_pip_not_taking_the_targets_markers_fails_loudly(offline: Path, monkeypatch) -> None:
    monkeypatch.setattr(wheelhouse, "PIP_SHIM", wheelhouse.PIP_SHIM.replace("markers.default_environment = target", ""))
    with pytest.raises(ConfigError, match=r"^pip \S+ no longer takes its marker environment"):
        resolve(["orchard-envdemo-dep"], BULLSEYE, what="test")


def test_conda_specs_become_pip_requirements() -> None:
    assert [
        conda_requirement(spec)
        for spec in ("numpy=1.16", "numpy=1.16=py36_0", "numpy>=1.16", "numpy >=1.16,<2", "conda-forge::pyyaml",
                     "scipy!=1.0", "numpy==1.16", "numpy=1.16.*")
    ] == ["numpy==1.16.*", "numpy==1.16", "numpy>=1.16", "numpy >=1.16,<2", "pyyaml", "scipy!=1.0", "numpy==1.16",
          "numpy==1.16.*"]  # fmt: skip
    text = "dependencies:\n  - python=3.9\n  - conda-forge::pip\n  - numpy>=1.16\n  - pip:\n    - x @ file:///x\n"
    assert environment_yml_requirements(text) == ["numpy>=1.16", "x @ file:///x"]  # the caller vets them
    for bad in ("dependencies: [a\n", "- a\n- b\n", "dependencies: 3\n"):
        with pytest.raises(ConfigError) as caught:
            environment_yml_requirements(bad, what="task t: environment.yml")
        assert "\n" not in str(caught.value) and str(caught.value).startswith("task t: environment.yml is not")


def test_the_image_tag_is_what_the_image_is_made_of(mirror) -> None:
    _root, setup, base = mirror
    task = _task(setup, base)
    tag = environments.image_tag(task, "sha256:b", setup)
    assert environments.image_tag(task.model_copy(update={"test_cmd": "pytest -x"}), "sha256:b", setup) == tag
    assert environments.image_tag(task.model_copy(update={"version": "0.2"}), "sha256:b", setup) != tag
    assert environments.image_tag(task, "sha256:b", base) != tag  # environment files read at another commit


# ---------------------------------------------------------------------------------------------
# with the engine
# ---------------------------------------------------------------------------------------------


def test_the_checkout_holds_nothing_newer_than_base_commit(docker_client, base_image, tmp_path: Path) -> None:
    """The mirror has a commit after base_commit, a branch and tags at it, a tag before, and a
    `base-<sha>` marker: the image's repository has base_commit's history and the old tag only."""
    repo = tmp_path / "mirror" / "orchard-test" / "future"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    old = _commit(repo, {"a.txt": "1\n"}, "old")
    _git(repo, "tag", "-a", "v1", "-m", "v1")
    base = _commit(repo, {"a.txt": "2\n"}, "base")
    _git(repo, "tag", f"base-{base}")
    future = _commit(repo, {"a.txt": "3\n"}, "future")
    _git(repo, "tag", "v2")
    _git(repo, "branch", "later")
    row = {"instance_id": "orchard-test__future-1", "repo": "orchard-test/future", "base_commit": base,
           "problem_statement": "x", "FAIL_TO_PASS": '["t"]'}  # fmt: skip
    image = task_image(SWETask.model_validate(row), RepoMirror(tmp_path / "mirror"))
    try:
        script = (
            f"git log --all --format=%H; git tag; git for-each-ref --format='%(refname)'; "
            f"git cat-file -e {future} 2>/dev/null && echo FUTURE-OBJECT; ls .git/objects/info"
        )
        out = (
            docker_client.containers.run(
                image, ["/bin/sh", "-c", script], working_dir="/testbed", remove=True, network_mode="none"
            )
            .decode()
            .split()
        )
    finally:
        docker_client.images.remove(image, force=True)
    assert sorted(out[:2]) == sorted([base, old]) and out[2:] == ["v1", "refs/tags/v1"]
    with pytest.raises(ConfigError, match="not a full commit sha"):
        repos.checkout(repo, tmp_path / "x", "--upload-pack=touch /tmp/x", what="t")


def test_the_image_installs_offline_from_the_wheelhouse(
    docker_client, base_image, client, offline: Path, mirror, envdemo_spec
) -> None:
    """Requirements read at environment_setup_commit (base_commit's would not resolve), less a
    line that does not build here, pinned pip packages, pre_install lines skipped (network) or
    failed, all recorded; `install` offline at build time and again in a sandbox, where `python`,
    `pip` and `pytest` are the venv's. The steps run in SWE-bench's order, a later one winning:
    the requirements' newest pin, then `pip_packages`' older one, then the repository's own
    requirement (rewritten by `pre_install`) of a newer one. How long each part took is kept.

    Slow: it resolves and downloads into a wheelhouse, then builds a task image from it offline.
    """
    root, setup, base = mirror
    task = _task(setup, base)
    lines: list[str] = []
    image = task_image(task, RepoMirror(root), log=lines.append)
    try:
        labels = docker_client.images.get(image).labels
        assert (
            labels["org.orchard.task.requirements"]
            == f"requirements/test.txt at {setup[:12]} (environment_setup_commit)"
        )
        assert labels["org.orchard.task.python"] == "3.11.2"
        left_out, skipped, failed = image_warnings(image)
        assert "orchard-envdemo-cext has no wheel for CPython 3.11" in left_out
        assert left_out.endswith("left out of the requirements")
        assert "pre_install `apt-get update && apt-get install -y locales` needs the network: skipped" in skipped
        assert "pre_install `locale-gen en_US.UTF-8` failed; the build went on" in failed
        assert all(f"warning: {warning}" in lines for warning in (left_out, skipped, failed))

        with client.create(image) as box:
            script = (
                "command -v python pip pytest; echo $PIP_NO_INDEX; cat /tmp/pre_install_ran; "
                "python -c 'import orchard_envdemo_pin as p, orchard_envdemo_req, orchard_envdemo_extra; print(p.PIN)'; "
                "python -m pip install -e '.[test]' >/dev/null 2>&1 && echo reinstalled; python -m pytest -q tests | tail -1"
            )
            out = box.exec(script, cwd=task.workdir, timeout=300).stdout.split("\n")
        venv = environments.VENV
        assert out[:4] == [f"{venv}/bin/python", f"{venv}/bin/pip", f"{venv}/bin/pytest", "1"]
        assert out[4:7] == ["ran", "2", "reinstalled"]
        assert "1 passed" in out[7]
        assert any(  # pip_packages' pin had won over the requirements' newest; the install replaced it
            "the repository's install replaces orchard-envdemo-pin==1.0: it asks for orchard-envdemo-pin>=2" in line
            for line in lines
        )
        build = environments.build_seconds(image)
        assert build is not None and min(build["interpreter"], build["dependencies"], build["repository"]) > 0
        assert build["total"] == pytest.approx(sum(build[part] for part in environments.BUILD_PARTS), abs=0.2)
        assert any(line.startswith(f"built {image} in ") for line in lines)
    finally:
        docker_client.images.remove(image, force=True)


def test_a_source_only_dependency_is_built_in_the_base_image(
    docker_client, base_image, offline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow: it builds a wheel from source with pip and a task image with it, as a user's first run does."""
    from orchard.env import images

    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))  # nothing built before
    target = Target(*images.base_facts(docker_client.images.get(base_image).labels))
    lines: list[str] = []
    house = Wheelhouse(docker_client, base_image, target, lines.append)
    wheels = {wheel.name: wheel for wheel in house.resolve(["orchard-envdemo-pure"], what="test")}
    assert set(wheels) == {"orchard-envdemo-pure", "orchard-envdemo-old"}  # the built wheel's own requirement
    assert Path(wheels["orchard-envdemo-pure"].url.removeprefix("file://")).parent == house.built
    assert any("building orchard_envdemo_pure-1.0.tar.gz in orchard/base:bookworm" in line for line in lines)
    assert not (offline / HOST_MARK).exists()  # its setup.py ran in the image only, never on this host

    with pytest.raises(SourceBuildFailed, match=r"not one wheel of orchard-envdemo-poison 1\.0"):
        house.resolve(["orchard-envdemo-poison"], what="test")
    assert sorted(path.name for path in house.built.iterdir()) == ["orchard_envdemo_pure-1.0-py3-none-any.whl"]

    with pytest.raises(SourceBuildFailed) as caught:
        house.resolve(["orchard-envdemo-cext"], what="task t: requirements")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("task t: requirements: orchard-envdemo-cext has no wheel for")
    assert "building its source distribution orchard_envdemo_cext-1.0.tar.gz" in message and "gcc" in message


def test_requirements_fall_back_to_base_commit_and_a_missing_one_names_it(
    docker_client, base_image, offline: Path, mirror, envdemo_spec
) -> None:
    root, _setup, base = mirror
    task = _task("0" * 40, base)  # an environment_setup_commit the mirror does not have
    lines: list[str] = []
    with pytest.raises(
        MissingWheel, match=r"requirements: no distribution of orchard-envdemo-req==9\.9 for CPython 3\.11"
    ):
        task_image(task, RepoMirror(root), log=lines.append)
    assert any("environment_setup_commit 000000000000 is not in the mirror" in line for line in lines)


def test_a_python_no_image_offers_runs_on_the_nearest_with_the_warning_on_the_image(
    docker_client, base_image, example_repos, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard.tasks import load_tasks

    task = load_tasks(
        Path(__file__).parents[2] / "examples" / "tasks" / "tasks.jsonl", ids=["orchard-examples__textkit-1"]
    )[0]
    task = task.model_copy(update={"python": "3.12"})
    lines: list[str] = []
    image = task_image(task, RepoMirror(example_repos), log=lines.append)
    try:
        assert docker_client.images.get(image).labels["org.orchard.base-release"] == "bookworm"
        (warning,) = image_warnings(image)
        assert "wants Python 3.12" in warning and "runs on Python 3.11 (orchard/base:bookworm)" in warning
        assert f"warning: {warning}" in lines
    finally:
        docker_client.images.remove(image, force=True)

    monkeypatch.setitem(environments.PYTHON_RELEASES, "3.13", "orchard-test-missing")
    with pytest.raises(ImageNotFound, match=r"run `orchard image build-base --release orchard-test-missing`"):
        task_image(task.model_copy(update={"python": "3.13"}), RepoMirror(example_repos))


def test_swebench_images_are_used_as_published_with_conda_activated(
    docker_client, base_image, client, example_repos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image laid out as SWE-bench's are (repository at /testbed, a `testbed` env that
    `/opt/miniconda3/bin/activate` + `conda activate testbed` put first on PATH), built offline
    and tagged with the official name: `--image-source swebench` uses it as it is, the agent's
    shell and the grader run in that env, and gold resolves. A missing one is pulled; the pull
    is answered as an engine without a registry answers (`docker pull` here: "dial tcp: lookup
    registry-1.docker.io ... no such host"), so the test sends nothing off this host."""
    import docker.errors
    import docker.models.images

    def unreachable(self, repository, tag=None, **kwargs):
        raise docker.errors.APIError(
            'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host'
        )

    monkeypatch.setattr(docker.models.images.ImageCollection, "pull", unreachable)
    from orchard.tasks import load_tasks

    examples = Path(__file__).parents[2] / "examples" / "tasks" / "tasks.jsonl"
    task, other = (
        each.model_copy(update={"workdir": "/testbed"})  # SWE-bench's rows leave it at its default
        for each in load_tasks(examples, ids=["orchard-examples__textkit-1", "orchard-examples__textkit-2"])
    )
    name = swebench_image_name(task)
    assert name == "swebench/sweb.eval.x86_64.orchard-examples_1776_textkit-1:latest"
    context = tmp_path / "context"
    subprocess.run(
        ["git", "clone", "-q", str(example_repos / task.repo.replace("/", "__")), str(context / "repo")], check=True
    )
    _git(context / "repo", "checkout", "-q", "--detach", task.base_commit)
    (context / "activate").write_text(
        'conda() { [ "$1" = activate ] && PATH="/opt/miniconda3/envs/$2/bin:$PATH" && export PATH CONDA_DEFAULT_ENV="$2"; }\n'
    )
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY activate /opt/miniconda3/bin/activate\n"
        "RUN python3 -m venv --without-pip --system-site-packages /opt/miniconda3/envs/testbed\n"
        "COPY repo /testbed\nWORKDIR /testbed\n"
    )
    docker_client.images.build(path=str(context), tag=name, network_mode="none", rm=True)
    try:
        assert task_image(task, RepoMirror(None, clone=False), source="swebench") == name
        with client.create(name) as box:
            task.start(box)
            out = box.exec("pwd; command -v python3; echo $CONDA_DEFAULT_ENV", session="agent").stdout.split()
        assert out == ["/testbed", "/opt/miniconda3/envs/testbed/bin/python3", "testbed"]
        grade = task.grade(client, task.gold(), name)
        assert grade.outcome == "resolved", grade.error

        with pytest.raises(
            ImageNotFound,
            match=r"swebench/sweb\.eval\.x86_64\.orchard-examples_1776_textkit-2:latest is not on this engine and pulling it failed",
        ):
            task_image(other, RepoMirror(None, clone=False), source="swebench")
    finally:
        docker_client.images.remove(name, force=True)


def test_the_venv_is_what_any_start_of_its_python_imports_from(client, base_image) -> None:
    """tox-current-env runs the tests with `.tox/py39/bin/python`, a link to the venv's python in
    another folder: such a start finds no `pyvenv.cfg` and runs as the base interpreter (sphinx's
    rows: `import docutils` failed). With `VENV_FOR_ANY_START`, as the image runs it, it imports
    what the venv holds."""
    venv = environments.VENV
    with client.create(base_image) as box:
        made = box.exec(
            f"/usr/bin/python3 -m venv --without-pip {venv} && site=$({venv}/bin/python -c "
            "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && mkdir -p $site/probe && "
            "echo 'WHERE = 1' > $site/probe/__init__.py && mkdir -p /w/.tox/py/bin && "
            f"ln -s {venv}/bin/python /w/.tox/py/bin/python"
        )
        assert made.ok, made
        assert "No module named 'probe'" in box.exec("/w/.tox/py/bin/python -c 'import probe'").stderr  # the break
        assert box.exec(environments.VENV_FOR_ANY_START).ok
        seen = box.exec("/w/.tox/py/bin/python -c 'import probe; print(probe.WHERE)'")
        assert seen.stdout == "1\n", seen
        assert box.exec(f"{venv}/bin/python -c 'import probe'").ok  # and the venv itself as before


def test_a_newer_python_reports_test_descriptions_as_the_one_asked_for(client, base_image) -> None:
    """Django 3.x rows ask for Python 3.6 and run on 3.9 here. Since 3.7 unittest describes a test
    whose docstring begins with a newline by its first non-empty line, which Django's verbose
    runner prints where SWE-bench's parser reads the test's name: tests that passed counted as
    missing. The image's edit makes the base interpreter describe them as 3.6 did."""
    (difference,) = [d for d in environments.DIFFERENCES if d.module == "unittest.case"]
    assert difference.applies("3.6", "3.11.2") and not difference.applies("3.9", "3.11.2")
    assert not difference.applies(None, "3.11.2") and not difference.applies("3.6", "3.6.15")
    script = (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_lead(self):\n        '''\n        Described on its second line.\n        '''\n"
        "    def test_first(self):\n        '''Described on its first line.'''\n"
        "unittest.main(verbosity=2)\n"
    )
    with client.create(base_image) as box:
        box.write_file("/tmp/t.py", script.encode())
        before = box.exec("cd /tmp && python3 t.py").stderr
        assert "Described on its second line." in before and "Described on its first line." in before  # 3.7+
        edited = box.exec(difference.command())
        assert edited.ok, edited
        after = box.exec("cd /tmp && python3 -B t.py && python3 t.py").stderr
        assert "Described on its second line." not in after and after.count("Described on its first line.") == 2
        assert re.search(r"^test_lead \(__main__\.T[.\w]*\) \.\.\. ok$", after, re.M)  # as the django parser reads
        again = box.exec(difference.command())  # an interpreter without the line: the build fails, naming it
        assert not again.ok and "does not say: return doc.strip()" in again.stderr
