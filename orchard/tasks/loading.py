"""Task sets from JSON, JSONL, a folder of task folders, a Hugging Face dataset folder, or a hub dataset id.

    load_tasks("examples/tasks/tasks.jsonl")
    load_tasks("path/to/saved_dataset")                  # datasets' save_to_disk folder
    load_tasks("princeton-nlp/SWE-bench_Lite", split="test")   # needs the hub (not here)
    load_tasks("claw-eval/tasks")                         # a folder of task folders (`FOLDERS`)
    load_tasks("miniwob:click-button,enter-text")         # a benchmark shipped in a package (`SCHEMES`)

Each record is validated as its kind's task class (its `kind` field, `swe` when absent); a bad
one is reported with its line (or index) and the field, and nothing is returned for a file with a
bad record. `read_records` is the one reader of JSON and JSONL files (tasks, predictions,
trajectories), so every file names a bad record the same way: `FILE, line N: ...`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchard.errors import ConfigError, InvalidRequest
from orchard.recipes import DEFAULT_KIND, merged
from orchard.registry import load
from orchard.tasks.base import TaskBase
from orchard.tasks.kinds import KINDS, task_class

FOLDERS: dict[str, str] = merged("folders")
"""Task sets laid out as folders of files, by format (the recipes'): `name -> "module:function"`, a function that
takes the folder and returns its tasks' (where, record) pairs, each record of a kind of `KINDS`,
or None for a folder not in its format (`read_folder` asks each in turn)."""


SCHEMES: dict[str, str] = merged("schemes")
"""Task sets named `scheme:argument` (MiniWoB++'s pages, shipped in a package), by scheme (the recipes'): a
function that takes the argument and returns the tasks' (where, record) pairs."""


def read_folder(path: Path) -> Iterable[tuple[str, Any]] | None:
    """The (where, record) pairs of a folder of one of the `FOLDERS` formats (the first whose reader
    knows it), or None when none does."""
    for name in FOLDERS:
        records = load(FOLDERS, name, "task folder reader")(path)
        if records is not None:
            return records
    return None


def load_tasks(source: str | Path, *, split: str = "test", ids: Sequence[str] | None = None) -> list[Any]:
    """The tasks of `source` (a file, a dataset folder or a hub id), optionally only `ids`."""
    path = Path(source)
    scheme, _, argument = str(source).partition(":")
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except OSError:  # no path at all (a name too long: `miniwob:` and many ids)
        is_file = is_dir = False
    if argument and scheme in SCHEMES and not (is_file or is_dir):
        records = load(SCHEMES, scheme, "task set reader")(argument)
    elif is_file:
        records = read_records(path, "tasks", keys=("tasks", "instances"))
    elif is_dir:
        found = read_folder(path)
        records = _records_of_dataset_folder(path, split) if found is None else found
    elif str(source).count("/") == 1 and not str(source).startswith((".", "/")):
        records = _records_of_hub(str(source), split)
    else:
        raise ConfigError(f"no task file or dataset at {source}")
    tasks = _validate(records, str(source), path.parent if is_file else None)
    if ids:
        wanted = set(ids)
        missing = sorted(wanted - {t.instance_id for t in tasks})
        if missing:
            raise InvalidRequest(f"{source} has no task {', '.join(missing)}")
        tasks = [t for t in tasks if t.instance_id in wanted]
    return tasks


def read_records(path: Path, what: str, *, keys: Sequence[str] = ()) -> Iterable[tuple[str, Any]]:
    """(`line N` or `item N`, record) of a JSONL file (blank lines skipped) or a JSON list; a JSON
    object holds the list under one of `keys`, or is itself keyed by id (when `keys` is empty)."""
    if path.suffix not in (".json", ".jsonl"):
        raise ConfigError(
            f"{path}: give {what} as .json or .jsonl"
            + (", or a dataset folder (parquet, arrow, save_to_disk)" if what == "tasks" else "")
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield f"line {number}", _json(line, f"{path}:{number}")
        return
    data = _json(text, str(path))
    if isinstance(data, dict):
        data = next((data[key] for key in keys if key in data), None) if keys else list(data.values())
    if not isinstance(data, list):
        raise ConfigError(f"{path} must hold a JSON list of {what} (or JSONL, one per line)")
    for index, record in enumerate(data):
        yield f"item {index}", record


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None


TEXT_COLUMNS = ("instance_id", "version", "base_commit", "environment_setup_commit", "created_at")
"""Columns whose values are text even where they look like numbers (SWE-bench's `version`: `3.10`, `0.20`)."""
DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet", ".arrow", ".txt", ".tsv")


def _only_csv(path: Path) -> bool:
    """Whether a dataset folder's data files are all CSV."""
    suffixes = {file.suffix for file in path.rglob("*") if file.is_file() and file.suffix in DATA_SUFFIXES}
    return suffixes == {".csv"}


def _records_of_dataset_folder(path: Path, split: str) -> Iterable[tuple[str, Any]]:
    import datasets

    try:
        if (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file():
            data = datasets.load_from_disk(str(path))
        elif _only_csv(path):  # as text: a CSV reader takes `3.10` for the number 3.1
            data = datasets.load_dataset(str(path), converters=dict.fromkeys(TEXT_COLUMNS, str))
        else:  # a folder of data files (parquet, json, ...), as on the hub
            data = datasets.load_dataset(str(path))
    except Exception as exc:  # no data files, unreadable ones, ...: one line
        raise ConfigError(
            f"cannot load a dataset from {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ConfigError(f"{path} has no split {split!r} (it has {', '.join(data)})")
        data = data[split]
    for index, record in enumerate(data):
        yield f"row {index}", record


def _records_of_hub(name: str, split: str) -> Iterable[tuple[str, Any]]:
    from orchard.config import require_hub

    require_hub(name)  # offline: one line now, not half a minute of retries first
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # offline, unknown id, ...: one line either way
        raise ConfigError(f"could not load the dataset {name!r} from the hub: {str(exc).splitlines()[0]}") from None
    for index, record in enumerate(data):
        yield f"row {index}", record


def _validate(records: Iterable[tuple[str, Any]], source: str, folder: Path | None) -> list[Any]:
    """Each record as its kind's task; `folder` is the task file's, where a kind may be named by a
    path or module. A dataset's rows (a folder, the hub) may only name kinds of `KINDS`: data
    fetched from elsewhere never picks the code that runs."""
    tasks: list[TaskBase] = []
    seen: set[str] = set()
    for where, record in records:
        if not isinstance(record, dict):
            raise ConfigError(f"{source}, {where}: a task must be a JSON object")
        kind = str(record.get("kind") or DEFAULT_KIND)
        try:
            if folder is None and kind not in KINDS:
                raise ConfigError(f"task kind {kind!r}: a dataset's rows may only name {', '.join(KINDS)}")
            cls = task_class(kind, relative_to=folder)
        except ConfigError as exc:
            raise ConfigError(f"{source}, {where}: {exc}") from None
        try:
            task = cls.model_validate(record, context={"folder": folder})
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in error["loc"]) or "task"
            raise ConfigError(f"{source}, {where}: {field}: {error['msg']}") from None
        if task.instance_id in seen:
            raise ConfigError(f"{source}, {where}: instance_id {task.instance_id} appears twice")
        seen.add(task.instance_id)
        tasks.append(task)
    if not tasks:
        raise ConfigError(f"{source} holds no tasks")
    return tasks
