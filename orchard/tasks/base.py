"""What every task kind is: the protocol the pipeline runs on, whatever the recipe.

A task kind is a task class: a pydantic model whose fields are what a task file holds and whose
methods say how the task's sandbox is prepared, what the agent may see, what an attempt produced
and how it is graded. Eval, collection, credit assignment, SFT, RL and the value model only ever
call these, so a new kind is one file (a subclass of `TaskBase`) plus a line in its recipe's
`kinds` (`orchard.recipes`); a task file picks its kind with a `kind` field (`swe` when absent).

    class Task(Protocol):
        instance_id, kind, workdir, problem_statement       # fields every kind has
        public() -> dict                                    # what an agent may see
        prompt() -> str                                     # the task as the first user turn
        sandbox_image(prepare) -> str                       # its sandbox's image, built offline if needed
        image_facts(image) -> dict                          # for the run's report: its build, its Python
        sandbox_init() -> str | None                        # run once as its sandbox starts (a browser)
        start(box)                                          # before the first step (in the agent's shell)
        respond(box, dialogue) -> str | None                # the user's answer when the agent ends its turn
        submission(box) -> str                              # what the attempt produced (SWE: the patch)
        conclude(box, messages, dialogue) -> str            # the same, told the conversation too
        grade(client, submission, image) -> Grade           # the verdict, score in [0, 1]
        progress(client, submission, image) -> float        # mid-episode, for credit by replay
        script(name) -> list[Step]                          # `scripted:gold` and friends
        gold() -> str                                       # the known solution as a submission

A submission is text, so the same store, predictions files and value model carry every kind's: a
patch for SWE, a JSON document of final state for kinds that are graded on state. It is untrusted
input to `grade`, whoever made it (an agent's sandbox, a predictions file): a kind grades what the
submission holds (a patch, the files' bytes), never what it claims about itself (a checksum, a
verdict).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from orchard.errors import ConfigError

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox

Metric = Literal["resolve_rate", "score"]

SANDBOX_LIMITS: dict[str, Any] = {"memory": "4Gi"}
"""What a task's sandbox may use unless its kind says otherwise: agent and grader sandboxes alike."""


@dataclass
class Step:
    """One step of a task's scripted solution (`script`): run a shell command, write a file, call
    one of the task's tools (`call`: `tool` with `arguments`), say `content` to the user (`say`:
    a reply without actions, which ends the episode unless the task's user answers), or submit.
    Harness-neutral: any harness writes it in its own format (`Harness.encode`)."""

    kind: Literal["bash", "write", "call", "say", "submit"]
    command: str = ""
    path: str = ""
    content: str = ""
    thought: str = ""
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Grade:
    """The verdict on one attempt. `outcome` is `resolved` when it passed; every other outcome
    names how it did not (a kind's own, e.g. SWE's `empty_patch`, `patch_failed`, `timeout`;
    `error` always means the task or the machine failed, not the attempt)."""

    instance_id: str
    outcome: str
    score: float = 0.0
    """In [0, 1]: 1 or 0 for a kind that grades pass/fail, partial credit for one that scores."""
    checks: dict[str, Any] = field(default_factory=dict)
    """Per-check details, for reports and for people."""
    error: str | None = None
    log: str = ""
    duration: float = 0.0
    suspicious: list[str] = field(default_factory=list)
    """Why the attempt looks like it reaches for the grader; empty when nothing does."""
    fault: Literal["task", "machine"] | None = None
    """Whose an `error` is: `task` (broken: its test patch does not apply, no test runs even
    without the patch; trying again finds the same), or `machine` (a sandbox died, a server went
    away: a resumed run tries again). An `error` that names none is the machine's."""

    @property
    def resolved(self) -> bool:
        return self.outcome == "resolved"

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "resolved": self.resolved}


@dataclass
class Prepare:
    """What kinds build their images from: for SWE, a local mirror of repositories."""

    repos: str | Path | None = None
    """A folder of git repositories (`DIR/owner/name` or `DIR/owner__name`), for SWE tasks."""
    image_source: str = "build"
    """`build`: images built offline; `swebench`: SWE-bench's published instance images."""
    _mirror: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.image_source not in ("build", "swebench"):
            raise ConfigError(f"image source {self.image_source!r} is neither build nor swebench")
        if self.repos is not None:
            self.mirror()  # a wrong folder is one error now, not one per task

    def mirror(self) -> Any:
        """The SWE repository mirror (one per `Prepare`, so clones are shared)."""
        if self._mirror is None:
            from orchard.tasks.repos import RepoMirror

            self._mirror = RepoMirror(self.repos)
        return self._mirror


class TaskBase(BaseModel):
    """Defaults for a task kind: a shell that starts in `workdir`, progress measured as the grade's
    score, no scripted solutions. Subclasses give `kind` their name as its default and implement
    `sandbox_image`, `submission` and `grade`."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    metric: ClassVar[Metric] = "resolve_rate"
    """How reports rank attempts: `resolve_rate` (pass/fail) or `score` (mean score, pass@k, pass^k)."""
    limits: ClassVar[dict[str, Any]] = SANDBOX_LIMITS
    """`Client.create` arguments for the task's sandboxes."""
    harnesses: ClassVar[tuple[str, ...]] = ("bash",)
    """The harnesses its tasks are worked through when a run names none."""
    submission_file: ClassVar[str] = "submission.txt"
    """The file an attempt's submission is written to in its run's folder (`orchard.eval.report`)."""
    empty_submission_fails: ClassVar[bool] = False
    """Whether an empty submission is graded a failure whatever the task (SWE: an empty diff fixes
    nothing): reranking never picks one over a sample that submitted something."""
    vision: ClassVar[bool] = False
    """Whether its agents see images (a browser's screenshots): a recipe's student is then a
    vision-language model."""

    instance_id: str
    kind: str
    problem_statement: str
    workdir: str = "/workspace"

    @model_validator(mode="before")
    @classmethod
    def _none_is_default(cls, data: Any) -> Any:
        """`None` means "the default": a Hugging Face dataset fills a row's missing fields with it."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    def public(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "problem_statement": self.problem_statement, "workdir": self.workdir}

    def prompt(self) -> str:
        return f"{self.problem_statement.strip()}\n\nYou work in {self.workdir} (your shell starts there)."

    def record(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    def sandbox_image(self, prepare: Prepare) -> str:
        raise NotImplementedError

    def image_facts(self, image: str) -> dict[str, Any]:
        """What the run's report says of this task's image: how long its build took (`build`:
        seconds by part, where this machine built it) and the Python asked for and run on
        (`python`); {} where a kind says nothing (its grades carry the image's warnings)."""
        return {}

    def attempt_report(self, grade: Grade, submission: str, details: dict[str, Any]) -> dict[str, Any]:
        """An attempt's `report.json` in its run's folder: the grade's details (`details`, the
        attempt's record less its log and files)."""
        return {key: value for key, value in details.items() if key not in ("log", "files")}

    def sandbox_init(self) -> str | None:
        """A shell command its sandboxes run once as they start, before one is handed over (a
        browser kind starts Chromium), or None. Unlike `start`, it knows nothing of the attempt,
        so a warm pool can run it ahead (`orchard.eval.attempt.TaskPools`)."""
        return None

    def start(self, box: Sandbox) -> None:
        box.exec(f"cd {shlex.quote(self.workdir)}", session="agent")

    def respond(self, box: Sandbox, dialogue: list[dict[str, Any]]) -> str | None:
        """The user's answer to the agent's last message (`dialogue[-1]`), or None: the episode ends.

        The agent ends its turn by submitting; what it said then (a final answer, or a question to
        the user) is the newest `assistant` entry of `dialogue`, the conversation between the user
        and the agent alone (the task's prompt first, no tool calls). A kind with a simulated user
        answers here, and the episode goes on; the default has none."""
        return None

    def submission(self, box: Sandbox) -> str:
        raise NotImplementedError

    def conclude(self, box: Sandbox, messages: list[dict[str, Any]], dialogue: list[dict[str, Any]]) -> str:
        """The submission of an episode whose conversation so far is `messages`, and its part
        between the user and the agent `dialogue` (see `respond`): the host's own record of them,
        never the sandbox's. `submission(box)` unless the kind grades the conversation too (an
        assistant's answer, a Claw-Eval grader reading the agent's messages)."""
        return self.submission(box)

    def grade(self, client: Client, submission: str, image: str) -> Grade:
        raise NotImplementedError

    def progress(self, client: Client, submission: str, image: str) -> float:
        return self.grade(client, submission, image).score

    def script(self, name: str) -> list[Step]:
        raise ConfigError(f"task {self.instance_id} ({self.kind}) has no scripted solution {name!r}")

    def gold(self) -> str:
        raise ConfigError(f"task {self.instance_id} ({self.kind}) has no known solution to grade as `gold`")


def task_sandbox(client: Client, task: Any, image: str, **overrides: Any) -> Any:
    """A fresh sandbox for `task` (an agent's or a grader's), with its kind's limits and its
    `sandbox_init` run there (a warm pool of the same kind hands over one that ran it already):
    the one place they are set. `init=None` among `overrides` leaves the init out."""
    return client.create(image, **{**sandbox_args(task), **overrides})


def sandbox_args(task: Any) -> dict[str, Any]:
    """The `Client.create` arguments of `task`'s sandboxes besides the image: its kind's limits,
    and its init when it has one."""
    init = task.sandbox_init() if hasattr(task, "sandbox_init") else None
    return {**type(task).limits, **({"init": init} if init is not None else {})}
