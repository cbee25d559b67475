"""SQLModel tables: sandboxes and their commands; runs, graded results, trajectories and steps; proxy calls."""

from __future__ import annotations

from sqlalchemy import BigInteger
from sqlmodel import Field, SQLModel

# Sizes in bytes are BIGINT: PostgreSQL's INTEGER stops at 2 GiB (SQLite's is 64-bit anyway).


class SandboxRecord(SQLModel, table=True):
    """One sandbox, from creation to deletion (rows are kept after deletion for history)."""

    __tablename__ = "sandboxes"

    id: str = Field(primary_key=True)
    backend: str
    image: str
    network: str = Field(description="blocked | open")
    cpu: float | None = None
    memory_bytes: int | None = Field(default=None, sa_type=BigInteger)
    owner: str = Field(index=True, description="who created it: a service or an SDK process")
    run_id: str | None = Field(default=None, index=True)
    status: str = Field(index=True, description="pending | ready | failed | deleted")
    status_message: str | None = None
    created_at: float
    ready_at: float | None = None
    deleted_at: float | None = None
    ttl: float
    heartbeat_at: float | None = Field(
        default=None, description="the client's last heartbeat (any replica of a fleet records it here)"
    )


class ExecRecord(SQLModel, table=True):
    """One command run in a sandbox (output itself is not stored, only its size)."""

    __tablename__ = "exec_jobs"

    id: str = Field(primary_key=True)
    sandbox_id: str = Field(index=True)
    command: str
    status: str = Field(description="queued | running | succeeded | failed")
    exit_code: int | None = None
    error: str | None = None
    stdout_bytes: int = Field(default=0, sa_type=BigInteger)
    stderr_bytes: int = Field(default=0, sa_type=BigInteger)
    created_at: float
    started_at: float | None = None
    completed_at: float | None = None
    duration: float | None = None
    runner: str | None = Field(default=None, description="the service process running it (host:pid:start)")


class JobAnswerRecord(SQLModel, table=True):
    """A finished job's whole answer (its output included), kept for a while so that any replica of
    a fleet can answer `GET /jobs/{id}` for a job another replica ran."""

    __tablename__ = "job_answers"

    job_id: str = Field(primary_key=True)
    answer: str = Field(description="JSON: the API's job object")
    completed_at: float = Field(index=True)


class ReplicaRecord(SQLModel, table=True):
    """One running replica of a fleet of services sharing this store, and its last sign of life."""

    __tablename__ = "replicas"

    id: str = Field(primary_key=True, description="the process (host:pid:start)")
    fleet: str = Field(index=True)
    started_at: float
    beat_at: float


class RunRecord(SQLModel, table=True):
    """One piece of work (an eval, a training stage, a benchmark) and how it went."""

    __tablename__ = "runs"

    id: str = Field(primary_key=True)
    kind: str = Field(index=True, description="eval | collect | credit | sft | rl | value | bench | proxy")
    name: str
    config: str = Field(default="{}", description="JSON: what the run was asked to do")
    status: str = Field(index=True, description="running | finished | failed | interrupted")
    owner: str = Field(description="the process running it (host:pid:start), to spot a killed run")
    host: str
    started_at: float
    ended_at: float | None = None
    summary: str = Field(default="{}", description="JSON: the run's headline figures")
    error: str | None = None


class ResultRecord(SQLModel, table=True):
    """One graded attempt: a task, under a harness, sample k, in a run."""

    __tablename__ = "results"

    id: str = Field(primary_key=True, description="run/instance/harness/sample")
    run_id: str = Field(index=True)
    instance_id: str = Field(index=True)
    harness: str
    sample: int
    outcome: str = Field(description="resolved | unresolved | empty_patch | patch_failed | timeout | error")
    resolved: bool
    patch: str = ""
    grade: str = Field(default="{}", description="JSON: per-test results, error, grading log tail")
    trajectory_id: str | None = Field(default=None, index=True)
    steps: int = 0
    tokens: int = 0
    created_at: float


class TrajectoryRecord(SQLModel, table=True):
    """One agent episode on one task: the whole conversation, the patch it left, its verdict."""

    __tablename__ = "trajectories"

    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    instance_id: str = Field(index=True)
    harness: str = Field(index=True)
    model: str
    sample: int = 0
    status: str = Field(description="completed | truncated | time_limit | aborted")
    error: str | None = None
    messages: str = Field(description="JSON: OpenAI-style chat messages")
    tools: str = Field(default="null", description="JSON: the tool schemas offered, or null")
    patch: str = ""
    outcome: str | None = Field(default=None, description="the grader's outcome, once graded")
    resolved: bool | None = None
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    format_errors: int = 0
    duration: float = 0.0
    created_at: float


class StepRecord(SQLModel, table=True):
    """One turn of an episode: the model's reply, the actions run, what came back."""

    __tablename__ = "steps"

    id: str = Field(primary_key=True, description="trajectory/index")
    trajectory_id: str = Field(index=True)
    index: int
    reply: str = Field(description="the assistant's text")
    actions: str = Field(default="[]", description="JSON: [{name, arguments}] parsed from the reply")
    observation: str = ""
    format_error: str | None = None
    finish_reason: str | None = Field(default=None, description="why the model stopped: stop, length, tool_calls")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration: float = 0.0
    value: float | None = Field(default=None, description="V(s_t) from credit assignment")
    credit: float | None = Field(default=None, description="c_t = V(s_t+1) - V(s_t)")


class MetricRecord(SQLModel, table=True):
    """One value of one metric of a run at one step (loss, reward, resolve rate, ...)."""

    __tablename__ = "metrics"

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(index=True)
    step: int
    name: str = Field(index=True)
    value: float
    recorded_at: float


class ProxyCallRecord(SQLModel, table=True):
    """One model call through `orchard proxy`: the request as sent, the answer as received (a
    stream assembled into one answer), and where it went in its conversation's trajectory."""

    __tablename__ = "proxy_calls"

    id: str = Field(primary_key=True)
    run_id: str = Field(index=True, description="the run of kind proxy it was recorded under")
    sandbox: str | None = Field(default=None, index=True, description="the sandbox tag of its path, if any")
    path: str = Field(description="the API path: /v1/chat/completions or /v1/completions")
    created_at: float = Field(index=True)
    duration: float = Field(default=0.0, description="seconds from the request to the answer's last byte")
    model: str | None = None
    status: str = Field(description="ok | failed")
    http_status: int | None = Field(default=None, description="the upstream's HTTP status; None if it never answered")
    error: str | None = None
    stream: bool = False
    request: str = Field(description="JSON: the request's body as the client sent it")
    answer: str = Field(default="null", description="JSON: the upstream's answer (a stream assembled into one)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: str = Field(
        default="null", description="JSON: {prompt, completion} token ids when the upstream sent them"
    )
    logprobs: str = Field(default="null", description="JSON: the first choice's log-probs when the upstream sent them")
    trajectory_id: str | None = Field(default=None, index=True)
    step: int | None = Field(default=None, description="its index among its trajectory's steps")
