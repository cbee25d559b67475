"""SQLModel tables of the environment layer: sandboxes and the commands run in them."""

from __future__ import annotations

from sqlmodel import Field, SQLModel


class SandboxRecord(SQLModel, table=True):
    """One sandbox, from creation to deletion (rows are kept after deletion for history)."""

    __tablename__ = "sandboxes"

    id: str = Field(primary_key=True)
    backend: str
    image: str
    network: str = Field(description="blocked | open")
    cpu: float | None = None
    memory_bytes: int | None = None
    owner: str = Field(index=True, description="who created it: a service or an SDK process")
    run_id: str | None = Field(default=None, index=True)
    status: str = Field(index=True, description="pending | ready | failed | deleted")
    status_message: str | None = None
    created_at: float
    ready_at: float | None = None
    deleted_at: float | None = None
    ttl: float


class ExecRecord(SQLModel, table=True):
    """One command run in a sandbox (output itself is not stored, only its size)."""

    __tablename__ = "exec_jobs"

    id: str = Field(primary_key=True)
    sandbox_id: str = Field(index=True)
    command: str
    status: str = Field(description="queued | running | succeeded | failed")
    exit_code: int | None = None
    error: str | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    created_at: float
    started_at: float | None = None
    completed_at: float | None = None
    duration: float | None = None
