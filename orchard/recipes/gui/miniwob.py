"""The `miniwob` task kind: MiniWoB++'s self-grading web pages, worked in the sandbox's Chromium.

    orchard eval --tasks miniwob:click-button,enter-text@3 --model scripted:solution
    orchard eval --tasks miniwob:all --model openai:MODEL

* **Pages.** MiniWoB++ ships 130 pages in the PyPI wheel `miniwob==1.1.0`
  (`miniwob/html/miniwob/NAME.html`, with the scripts they load from `html/core/` and
  `html/common/`). Orchard does not depend on the package (it pulls selenium and gymnasium): the
  wheel is fetched once with the host's pip into `settings().cache_dir / "miniwob"`, its sha256
  checked against `WHEEL_SHA256`, and its `html/` tree unpacked (every member's name checked: no
  absolute path, no `..`, no link, a bound on the total). The image `orchard/gui-miniwob:1.1.0`
  is the browser image with that tree at `/opt/miniwob/html` (`build_image`, built offline once;
  its labels name the tree and the browser image, so a change of either rebuilds it). The pages
  of the `flight/` tree need an HTTP server and are not offered.
* **Task set.** `miniwob:ARG` (`read_spec`): `all` or page names separated by commas, each
  optionally `NAME@N` for seeds 0 to N-1; instance ids `miniwob/NAME/SEED`.
* **Episode.** The page opens as `file:///opt/miniwob/html/miniwob/NAME.html` (the sandbox's
  network stays blocked: it needs none). Once it has loaded, `on_load` does what MiniWoB's own
  Python driver does: `Math.seedrandom(seed)`, then `core.startEpisodeReal()`, which draws the
  problem and writes its instruction (the utterance) in the page's yellow box; before that it
  raises the page's time limit (`core.EPISODE_MAX_TIME`, 10 to 30 s, made for scripted agents)
  to `episode_seconds`. The page allows one episode: the START cover that comes back when it ends
  starts no other. The agent may open no other URL than the page itself (`allows`).
* **Grade.** The page grades itself: its handlers call `core.endEpisode(reward)`, which sets the
  globals `WOB_DONE_GLOBAL`, `WOB_RAW_REWARD_GLOBAL` (in [-1, 1]) and `WOB_REWARD_REASON`.
  `finish` reads them (`Browser.evaluate`) from the tab where `on_load` started the episode, and
  the submission is that JSON. Resolved when the raw reward is above 0 (MiniWoB's success), score
  `max(raw reward, 0)`; `failed` when the page ended the episode with no reward, `timeout` when
  its timer ran out, `not_done` when the episode never ended (or the page was reloaded, so its
  episode was not the task's). The submission is untrusted text: parsed with bounds and types, a
  malformed one is an `error` grade that says what is wrong.

What is not protected: the reward is computed by the page inside the sandbox, so a compromised
sandbox (or a predictions file) can claim any reward; the grade checks only that the claim is
well formed and names this task's page and seed. The agent itself has only browser actions (the
harnesses give it no shell and no JavaScript), and `allows` keeps `javascript:` URLs and other
pages out. Pages that read the clock (`new Date()`) are not fully fixed by the seed.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import math
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from functools import cache
from pathlib import Path, PurePosixPath
from string import Template
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from orchard.config import settings
from orchard.errors import ConfigError, ImageNotFound, OrchardError
from orchard.recipes.gui.task import BrowserTask
from orchard.tasks.base import Grade, Prepare, Step

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox
    from orchard.recipes.gui.browser import Browser

Log = Callable[[str], None]

VERSION = "1.1.0"
WHEEL = f"miniwob-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "297006e84219d56ad037e843527ed773a4a82509dc43b6031ec4a3ad3e3e61d9"
"""The sha256 of the wheel on PyPI; a file that differs is refused."""
TREES = ("miniwob", "core", "common")
"""The folders of the wheel's `miniwob/html/` that are unpacked: the pages and what they load."""
MAX_TREE_BYTES = 64 << 20
"""The most the unpacked tree may hold (it holds about 2.7 MB)."""
IMAGE = f"orchard/gui-miniwob:{VERSION}"
HTML = "/opt/miniwob/html"
"""Where the tree is in the image."""
IMAGE_FORMAT = "1"
"""Bump when the image's recipe changes, so images of the old one are rebuilt."""
TREE_LABEL = "org.orchard.miniwob.tree"
BROWSER_LABEL = "org.orchard.miniwob.browser"
MAX_SEEDS = 1000
"""The most seeds `NAME@N` may ask of one page."""
LOAD_TIMEOUT = 15.0
"""Seconds a loaded page has to show MiniWoB's core and start its episode."""
MAX_SUBMISSION = 64 << 10
MAX_TEXT = 500
"""Characters kept of the page's reason and utterance, and of the agent's answer."""
PROMPT = (
    "Do the task the page's yellow box asks for (its instruction appears there once the page has "
    "started), with the browser's actions only. The page checks the result itself; when you have "
    "done what it asks, call `done`."
)


# ---------------------------------------------------------------------------------------------
# the wheel and its pages
# ---------------------------------------------------------------------------------------------


def _folder() -> Path:
    return settings().cache_dir / "miniwob"


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """One process at a time fetches or unpacks (pytest-xdist workers, parallel CLIs)."""
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel(log: Log | None = None) -> Path:
    """The wheel `miniwob==VERSION` in the cache, fetched once with the host's pip (its index and
    configuration, `--no-deps`); ConfigError when it cannot be fetched or its sha256 is not
    `WHEEL_SHA256`."""
    path = _folder() / WHEEL
    with _locked("wheel"):
        if path.is_file() and _sha256(path) == WHEEL_SHA256:
            return path
        (log or (lambda _line: None))(f"fetching {WHEEL} with pip")
        with tempfile.TemporaryDirectory(prefix="orchard-miniwob-", dir=_folder()) as tmp:
            argv = [sys.executable, "-m", "pip", "download", f"miniwob=={VERSION}", "--no-deps"]
            argv += ["--only-binary=:all:", "--no-cache-dir", "--dest", tmp]
            env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)
            except subprocess.TimeoutExpired:
                raise ConfigError(f"pip took more than 600 s to fetch {WHEEL}") from None
            fetched = Path(tmp) / WHEEL
            if done.returncode != 0 or not fetched.is_file():
                tail = " | ".join((done.stderr + done.stdout).strip().splitlines()[-2:])
                raise ConfigError(f"could not fetch {WHEEL} with pip (MiniWoB++'s pages): {tail}")
            if (found := _sha256(fetched)) != WHEEL_SHA256:
                raise ConfigError(f"{WHEEL} from the package index has sha256 {found}, not {WHEEL_SHA256}: refused")
            os.replace(fetched, path)
        return path


def _members(archive: zipfile.ZipFile) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """(member, path under `html/`) of each file of `TREES`; ConfigError for a name that is
    absolute, climbs with `..`, is a link, or a tree over `MAX_TREE_BYTES`."""
    found, total = [], 0
    for info in archive.infolist():
        name = info.filename
        if name.startswith("/") or "\\" in name or ".." in name.split("/") or ":" in name.split("/")[0]:
            raise ConfigError(f"{WHEEL} holds the member {name[:200]!r}, which would leave its folder: refused")
        prefix, _, rest = name.partition("miniwob/html/")
        if prefix or not rest or rest.split("/")[0] not in TREES or info.is_dir():
            continue
        mode = info.external_attr >> 16
        if mode and (mode & 0o170000) not in (0, 0o100000):
            raise ConfigError(f"{WHEEL} holds {name[:200]!r}, which is not a plain file: refused")
        total += info.file_size
        if total > MAX_TREE_BYTES:
            raise ConfigError(f"{WHEEL}'s html tree holds more than {MAX_TREE_BYTES >> 20} MiB: refused")
        found.append((info, PurePosixPath(posixpath.normpath(rest))))
    return found


def html_tree(log: Log | None = None) -> Path:
    """The wheel's `html/` tree (`TREES` only), unpacked once into the cache."""
    source = wheel(log)
    target = _folder() / f"html-{WHEEL_SHA256[:12]}"
    with _locked("tree"):
        if (target / "miniwob" / "click-button.html").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".html-", dir=_folder()))
        staging.chmod(0o755)  # mkdtemp makes it 0700, and the image keeps the mode
        try:
            with zipfile.ZipFile(source) as archive:
                for info, relative in _members(archive):
                    out = staging.joinpath(*relative.parts)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as member, out.open("wb") as handle:
                        shutil.copyfileobj(member, handle)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


@cache
def pages() -> tuple[str, ...]:
    """The names of MiniWoB++'s pages (`click-button`, ...), sorted, from the wheel's listing."""
    with zipfile.ZipFile(wheel()) as archive:
        names = [
            PurePosixPath(n).stem
            for n in archive.namelist()
            if PurePosixPath(n).parent.as_posix() == "miniwob/html/miniwob"
        ]
    return tuple(sorted(n for n in names if n and not n.startswith(".")))


def unknown_page(name: str) -> str:
    """The line that says `name` is no page of MiniWoB++, with the closest names."""
    close = difflib.get_close_matches(name, pages(), n=4, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else f"; `miniwob:all` runs all {len(pages())}"
    return f"MiniWoB++ {VERSION} has no page {name!r}{hint}"


def read_spec(argument: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, record) of the tasks `miniwob:ARGUMENT` names: `all`, or page names separated by
    commas, each optionally `NAME@N` (seeds 0 to N-1; one seed, 0, by default)."""
    chosen: dict[str, int] = {}
    named: set[str] = set()
    for item in (part.strip() for part in argument.split(",")):
        name, at, count = item.partition("@")
        name = name.strip()
        if not name:
            raise ConfigError(f"miniwob:{argument}: name a page (or `all`) before each comma and each @")
        seeds = 1
        if at:
            try:
                seeds = int(count)
            except ValueError:
                raise ConfigError(
                    f"miniwob:{argument}: {item!r}: the number of seeds after @ is not a whole number"
                ) from None
            if not 1 <= seeds <= MAX_SEEDS:
                raise ConfigError(f"miniwob:{argument}: {item!r}: ask for 1 to {MAX_SEEDS} seeds")
        if name != "all" and name not in pages():
            raise ConfigError(f"miniwob:{argument}: {unknown_page(name)}")
        if name in named:
            raise ConfigError(f"miniwob:{argument}: {name} is named twice")
        named.add(name)
        for each in pages() if name == "all" else (name,):
            chosen[each] = max(chosen.get(each, 0), seeds)
    return [
        (
            f"page {name}, seed {seed}",
            {"instance_id": f"miniwob/{name}/{seed}", "kind": "miniwob", "env": name, "seed": seed},
        )
        for name, seeds in chosen.items()
        for seed in range(seeds)
    ]


# ---------------------------------------------------------------------------------------------
# the image
# ---------------------------------------------------------------------------------------------


def tree_key() -> str:
    """Names what the image's tree is made of: the wheel, the folders taken, the recipe."""
    return hashlib.sha256(json.dumps([WHEEL_SHA256, TREES, HTML, IMAGE_FORMAT]).encode()).hexdigest()[:16]


def build_image(force: bool = False, log: Log | None = None) -> str:
    """`IMAGE`: the browser image (`orchard.recipes.gui.image`) with the pages at `HTML`,
    built with no network from a temporary context, and reused while its labels name the same
    tree and browser image, unless `force`."""
    import docker.errors

    from orchard.env import images
    from orchard.recipes.gui.image import build_image as browser_image
    from orchard.tasks.wheelhouse import docker_build, plain

    say = log or images.quiet
    browser = browser_image(log=log)
    with closing(images.docker_client()) as client:
        try:
            browser_id = str(client.images.get(browser).id)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"the browser image {browser} is missing: run `orchard image build browser`") from None
        labels = {TREE_LABEL: tree_key(), BROWSER_LABEL: browser_id, "org.orchard.built-by": "orchard"}
        with images.build_lock(IMAGE):
            try:
                previous = client.images.get(IMAGE)
            except docker.errors.ImageNotFound:
                previous = None
            if (
                previous is not None
                and not force
                and all((previous.labels or {}).get(k) == v for k, v in labels.items())
            ):
                return IMAGE
            tree = html_tree(log)
            with tempfile.TemporaryDirectory(prefix="orchard-miniwob-image-") as tmp:
                context = Path(tmp)
                shutil.copytree(tree, context / "html")
                (context / "Dockerfile").write_text(f"FROM {browser}\nCOPY html {HTML}\n")

                def failed(error: str, output: str) -> Exception:
                    return ConfigError(f"building {IMAGE} failed: {error.strip() or plain(output)[-300:]}")

                say(f"building {IMAGE} from {browser}")
                docker_build(client, context, IMAGE, failed, labels)
            if previous is not None and previous.id != client.images.get(IMAGE).id:
                with suppress(docker.errors.APIError):  # still used by a container
                    client.images.remove(previous.id)
    return IMAGE


# ---------------------------------------------------------------------------------------------
# the kind
# ---------------------------------------------------------------------------------------------

MARK = "__orchard_miniwob"
"""The page's global that says `on_load` started its episode (what task, what seed)."""

START_JS = Template("""(() => {
  if (window.$mark) return 'started';
  if (typeof core === 'undefined' || typeof genProblem !== 'function') return 'no miniwob';
  if (!core.cover_div) return 'loading';
  Math.seedrandom($seed);
  core.EPISODE_MAX_TIME = $ms;
  core.startEpisodeReal();
  core.cover_div.onclick = null;
  Object.defineProperty(window, $mark_name, {value: Object.freeze($record), writable: false, configurable: false});
  return 'started';
})()""")
"""Seeds the page, raises its time limit and starts its one episode (the cover that comes back when
it ends has no START any more), as MiniWoB's own driver does, then marks the page."""

READY_JS = "typeof WOB_TASK_READY === 'undefined' || WOB_TASK_READY === true"

READ_JS = Template("""(() => {
  const mark = window.$mark;
  if (!mark) return null;
  const text = (v) => (v === null || v === undefined) ? null : String(v).slice(0, $max);
  const number = (v) => (typeof v === 'number' && isFinite(v)) ? v : null;
  return {env: mark.env, seed: mark.seed, done: WOB_DONE_GLOBAL === true, reward: number(WOB_REWARD_GLOBAL),
    raw_reward: number(WOB_RAW_REWARD_GLOBAL), reason: text(WOB_REWARD_REASON), episodes: number(WOB_EPISODE_ID),
    utterance: text(core.getUtterance())};
})()""").substitute(mark=MARK, max=MAX_TEXT)
"""The page's reward globals, where `on_load` started the episode (null elsewhere)."""


class MiniWobTask(BrowserTask):
    """One seeded episode of one MiniWoB++ page."""

    kind: str = "miniwob"
    env: str = Field(description="the page's name, as in the wheel (`click-button`): `pages()`")
    seed: int = Field(default=0, ge=0, lt=2**31, description="what `Math.seedrandom` gets: the problem the page draws")
    episode_seconds: float = Field(
        default=600, gt=0, le=86400, description="the page's own time limit (MiniWoB's 10 s, raised for LLM agents)"
    )
    problem_statement: str = PROMPT

    @field_validator("env")
    @classmethod
    def _known_page(cls, value: str) -> str:
        if value not in pages():
            raise ValueError(unknown_page(value))
        return value

    def public(self) -> dict[str, Any]:
        return {**super().public(), "env": self.env, "seed": self.seed}

    def sandbox_image(self, prepare: Prepare) -> str:
        return build_image()

    def start_url(self) -> str:
        return f"file://{HTML}/miniwob/{self.env}.html"

    def allows(self, url: str) -> bool:
        """The page itself only (a reload: its episode is then not the task's, and grades `not_done`)."""
        return url.partition("#")[0] == self.start_url()

    def on_load(self, browser: Browser) -> None:
        """Seed the page, raise its time limit, start its episode, and wait until it is ready."""
        start = START_JS.substitute(
            mark=MARK,
            mark_name=json.dumps(MARK),
            seed=int(self.seed),
            ms=int(self.episode_seconds * 1000),
            record=json.dumps({"env": self.env, "seed": self.seed}),
        )
        deadline = time.monotonic() + LOAD_TIMEOUT
        state = browser.evaluate(start)
        while state != "started" or browser.evaluate(READY_JS) is not True:
            if time.monotonic() > deadline:
                raise OrchardError(f"the MiniWoB++ page {self.env} did not start in {LOAD_TIMEOUT:g} s ({state})")
            time.sleep(0.05)
            if state != "started":
                state = browser.evaluate(start)

    def finish(self, box: Sandbox, browser: Browser | None, answer: str, screenshots: list[str]) -> str:
        """`{"env", "seed", "answer", "page"}`: `page` the reward globals of the tab where the
        episode ran (None when no tab holds it), or `error` when the browser could not be read."""
        record: dict[str, Any] = {"env": self.env, "seed": self.seed, "answer": str(answer)[:MAX_TEXT]}
        if browser is None:
            return json.dumps({**record, "error": "the browser had died: the page's reward could not be read"})
        try:
            record["page"] = self._read_page(browser)
        except OrchardError as exc:
            return json.dumps({**record, "error": f"the page's reward could not be read: {exc}"})
        return json.dumps(record)

    def _read_page(self, browser: Browser) -> Any:
        """The reward globals of the first tab (the active one first) showing the page started by
        `on_load`; None when no tab does."""
        for tab in sorted(browser.tabs(), key=lambda t: not t.active):
            if tab.url.partition("#")[0] != self.start_url():
                continue
            if not tab.active:
                browser.switch_tab(tab.index)
            found = browser.evaluate(READ_JS)
            if found is not None:
                return found
        return None

    def grade(self, client: Client | None, submission: str, image: str = "") -> Grade:
        try:
            page = _parsed(submission, self)
        except _Malformed as exc:
            return Grade(self.instance_id, "error", error=f"the submission is malformed: {exc}")
        except _Failed as exc:
            return Grade(self.instance_id, "error", error=str(exc))
        if page is None:
            why = "no tab shows the page's episode (the page was reloaded, closed, or left)"
            return Grade(self.instance_id, "not_done", checks={"why": why})
        checks = {key: page[key] for key in ("raw_reward", "reward", "reason", "episodes", "utterance")}
        if not page["done"]:
            return Grade(self.instance_id, "not_done", checks={**checks, "why": "the page's episode never ended"})
        raw = page["raw_reward"]
        if raw > 0:
            return Grade(self.instance_id, "resolved", score=min(raw, 1.0), checks=checks)
        timed_out = page["reason"] == "timed out"
        return Grade(self.instance_id, "timeout" if timed_out else "failed", checks=checks)

    def script(self, name: str) -> list[Step]:
        """`solution` (also `gold`) and `wrong`, for the pages of `SCRIPTS`: abstract browser steps
        whose targets and texts are JavaScript that reads the page's own DOM and utterance (the
        page is drawn at random: there is no `gold()` submission)."""
        scripts = SCRIPTS.get(self.env, {})
        steps = scripts.get("solution" if name == "gold" else name)
        if steps is None:
            return super().script(name)
        return [Step(**step) for step in steps]


class _Malformed(ValueError):
    """A submission that is not what `finish` writes."""


class _Failed(Exception):
    """A submission that says the page could not be read."""


def _parsed(submission: str, task: MiniWobTask) -> dict[str, Any] | None:
    """The checked page record of a submission, None when it names none; `_Malformed` naming what
    is wrong, `_Failed` with the reason the submission gives for having none."""
    if not isinstance(submission, str) or len(submission) > MAX_SUBMISSION:
        raise _Malformed(f"it is not text of at most {MAX_SUBMISSION >> 10} KiB")
    try:
        data = json.loads(submission)
    except (ValueError, RecursionError):
        raise _Malformed("it is not JSON") from None
    if not isinstance(data, dict):
        raise _Malformed("it is not a JSON object")
    if data.get("env") != task.env or data.get("seed") != task.seed or isinstance(data.get("seed"), bool):
        raise _Malformed(
            f"it is of page {str(data.get('env'))[:80]!r}, seed {str(data.get('seed'))[:20]}, not this task's"
        )
    if "error" in data:
        raise _Failed(str(data["error"])[:MAX_TEXT])
    page = data.get("page")
    if page is None:
        return None
    if not isinstance(page, dict):
        raise _Malformed("its page is not a JSON object")
    if page.get("env") != task.env or page.get("seed") != task.seed:
        raise _Malformed("its page was started for another task")
    if not isinstance(page.get("done"), bool):
        raise _Malformed("its page's `done` is not true or false")
    checked: dict[str, Any] = {"done": page["done"]}
    for key in ("raw_reward", "reward", "episodes"):
        value = page.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            raise _Malformed(f"its page's `{key}` is not a number")
        checked[key] = float(value)
    if not -1.0 - 1e-9 <= checked["raw_reward"] <= 1.0 + 1e-9:
        raise _Malformed(f"its page's raw reward {checked['raw_reward']:g} is outside [-1, 1]")
    if checked["episodes"] not in (0.0, 1.0):
        raise _Malformed(f"its page ran {checked['episodes']:g} episodes, not one")
    checked["episodes"] = int(checked["episodes"])
    if checked["done"] != (checked["episodes"] == 1):
        raise _Malformed("its page's `done` and its episode count disagree")
    for key in ("reason", "utterance"):
        value = page.get(key)
        if value is not None and not isinstance(value, str):
            raise _Malformed(f"its page's `{key}` is not text")
        checked[key] = value[:MAX_TEXT] if isinstance(value, str) else None
    return checked


# ---------------------------------------------------------------------------------------------
# scripted solutions
# ---------------------------------------------------------------------------------------------


def _click(target: str | dict[str, str]) -> dict[str, Any]:
    return {"kind": "call", "tool": "click", "arguments": {"target": target}}


def _write(target: str | dict[str, str], text_js: str | None = None, text: str = "") -> dict[str, Any]:
    arguments: dict[str, Any] = {"target": target, "text": text}
    if text_js is not None:
        arguments["text_js"] = text_js
    return {"kind": "call", "tool": "write", "arguments": arguments}


def _select(target: str | dict[str, str], text_js: str) -> dict[str, Any]:
    return {"kind": "call", "tool": "select", "arguments": {"target": target, "text_js": text_js}}


def _press(*keys: str) -> dict[str, Any]:
    return {"kind": "call", "tool": "press", "arguments": {"keys": list(keys)}}


def _js(body: str) -> dict[str, str]:
    """A target found by JavaScript: `body` sees `U`, the page's utterance, and returns an element."""
    return {"js": f"(() => {{ const U = core.getUtterance(); {body} }})()"}


def _text(body: str) -> str:
    """Text to type, computed by JavaScript that sees `U`, the page's utterance."""
    return f"(() => {{ const U = core.getUtterance(); {body} }})()"


QUOTED = 'const Q = [...U.matchAll(/"([^"]*)"/g)].map(m => m[1]);'
"""`Q`: the quoted parts of the utterance, in order."""
BOLD = "document.querySelector('#query .bold').textContent"
NOWHERE = "#query"
"""What a wrong script clicks where the page has no wrong answer to give: the instruction itself
(the episode then never ends)."""
MOST_CHECKBOXES = 6
WANTED = (
    "const listed = U.replace(/^Select /, '').replace(/ and click Submit\\.$/, '');"
    " const want = new Set(listed === 'nothing' ? [] : listed.split(', '));"
)
"""`want`: the names of the checkboxes the utterance asks to tick."""
AUTOCOMPLETE = (
    f"{QUOTED} return ui_utils.COUNTRIES.find(c => c.startsWith(Q[0]) && (Q.length < 2 || c.endsWith(Q[1])));"
)
CHOSEN = "U.match(/^Select (.*) from the list/)[1]"
TAB = "U.match(/Tab #\\d/)[0]"


def _pick(selector: str, test: str, fallback: str | None = None) -> dict[str, str]:
    """The first element of `selector` for which `test` holds (of `e`; it sees `U` and `Q`), else
    the element of `fallback` (else nothing: the harness then ends the episode)."""
    body = f"{QUOTED} return [...document.querySelectorAll({json.dumps(selector)})].find(e => {test})"
    return _js(body + (f" || document.querySelector({json.dumps(fallback)});" if fallback else ";"))


def _checkboxes(wrong: bool) -> list[dict[str, Any]]:
    """Each step ticks or unticks the first box that is wrong (right, for `wrong`), and clicks
    Submit when none is left; nothing once the episode is over, so the script ends there."""
    test = "===" if wrong else "!=="
    body = (
        f"{WANTED} if (WOB_DONE_GLOBAL) return null;"
        " return [...document.querySelectorAll('#boxes input[type=checkbox]')]"
        f".find(b => b.checked {test} want.has(b.parentNode.textContent)) || document.querySelector('#subbtn');"
    )
    return [_click(_js(body))] * (MOST_CHECKBOXES + 1)


SCRIPTS: dict[str, dict[str, list[dict[str, Any]]]] = {
    "click-button": {
        "solution": [_click(_pick("#area button", "e.textContent === Q[0]"))],
        "wrong": [_click(_pick("#area button", "e.textContent !== Q[0]", NOWHERE))],
    },
    "click-link": {
        "solution": [_click(_pick("#area .alink", "e.textContent === Q[0]"))],
        "wrong": [_click(_pick("#area .alink", "e.textContent !== Q[0]", NOWHERE))],
    },
    "enter-text": {
        "solution": [_write("#tt", BOLD), _click("#subbtn")],
        "wrong": [_write("#tt", f"'x' + {BOLD}"), _click("#subbtn")],
    },
    "focus-text": {"solution": [_click("#tt")], "wrong": [_click(NOWHERE)]},
    "click-checkboxes": {"solution": _checkboxes(wrong=False), "wrong": _checkboxes(wrong=True)},
    "click-tab": {
        "solution": [_click(_pick("#area ul a", f"e.textContent === {TAB}"))],
        "wrong": [_click(_pick("#area ul a", f"e.textContent !== {TAB}"))],
    },
    "enter-password": {
        "solution": [_write("#password", BOLD), _write("#verify", BOLD), _click("#subbtn")],
        "wrong": [_write("#password", BOLD), _write("#verify", f"{BOLD} + 'x'"), _click("#subbtn")],
    },
    "login-user": {
        "solution": [
            _write("#username", _text(f"{QUOTED} return Q[0];")),
            _write("#password", _text(f"{QUOTED} return Q[1];")),
            _click("#subbtn"),
        ],
        "wrong": [
            _write("#username", _text(f"{QUOTED} return Q[0];")),
            _write("#password", _text(f"{QUOTED} return Q[1] + 'x';")),
            _click("#subbtn"),
        ],
    },
    "click-dialog": {"solution": [_click("button.ui-dialog-titlebar-close")], "wrong": [_click("#dialog p")]},
    "choose-list": {
        "solution": [_select("#options", _text(f"return {CHOSEN};")), _click("#area button")],
        "wrong": [
            _select(
                "#options",
                _text(
                    f"return [...document.querySelectorAll('#options option')].map(o => o.textContent).find(t => t !== {CHOSEN});"
                ),
            ),
            _click("#area button"),
        ],
    },
    # Tab leaves the field: its blur cancels the suggestions' pending search and closes their
    # menu, which would otherwise open over Submit a moment after the typing.
    "use-autocomplete": {
        "solution": [_write("#tags", _text(AUTOCOMPLETE)), _press("Tab"), _click("#subbtn")],
        "wrong": [_write("#tags", text="zzz"), _press("Tab"), _click("#subbtn")],
    },
}
"""Scripted `solution` and `wrong` steps by page (the harnesses resolve each target and text in the
live page when the step is played)."""


def _finite(value: int | float) -> bool:
    """A finite number a float can hold (a 400-digit JSON integer cannot)."""
    try:
        return math.isfinite(value) and abs(float(value)) < 1e300
    except OverflowError:
        return False
