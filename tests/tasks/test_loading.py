"""Task sets: the schema, JSON / JSONL / dataset folders, and one clear line per bad record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.errors import ConfigError, InvalidRequest
from orchard.recipes.swe.grading import touched_files
from orchard.recipes.swe.task import SWETask
from orchard.tasks import load_tasks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "tasks.jsonl"


def task(**overrides) -> dict:
    base = {
        "instance_id": "acme__widgets-1",
        "repo": "acme/widgets",
        "base_commit": "abc123",
        "problem_statement": "It breaks.",
        "FAIL_TO_PASS": ["tests/test_a.py::test_new"],
        "PASS_TO_PASS": ["tests/test_a.py::test_old"],
    }
    return {**base, **overrides}


def test_the_example_set_loads_and_hides_the_fix_from_agents():
    tasks = load_tasks(EXAMPLES)
    assert len(tasks) >= 12 and len({t.repo for t in tasks}) >= 3
    public = tasks[0].public()
    assert set(public) == {"instance_id", "repo", "problem_statement", "hints_text", "workdir"}
    assert tasks[0].extra["difficulty"] in ("easy", "medium", "hard")  # unknown fields are kept
    assert load_tasks(EXAMPLES, ids=[tasks[1].instance_id]) == [tasks[1]]


def test_swebench_json_string_lists_and_defaults():
    parsed = SWETask.model_validate(task(FAIL_TO_PASS='["t::a", "t::b"]', PASS_TO_PASS=""))
    assert parsed.fail_to_pass == ["t::a", "t::b"] and parsed.pass_to_pass == []
    assert parsed.workdir == "/testbed" and parsed.tests == ["t::a", "t::b"]
    assert parsed.record()["FAIL_TO_PASS"] == ["t::a", "t::b"]


def test_json_list_and_jsonl(tmp_path: Path):
    listed = tmp_path / "tasks.json"
    listed.write_text(json.dumps([task(), task(instance_id="acme__widgets-2")]))
    assert [t.instance_id for t in load_tasks(listed)] == ["acme__widgets-1", "acme__widgets-2"]
    lines = tmp_path / "tasks.jsonl"
    lines.write_text(json.dumps(task()) + "\n\n")
    assert len(load_tasks(lines)) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"instance_id": "x"', "tasks.jsonl:1: not valid JSON"),
        (json.dumps(task(repo="widgets")), "line 1: repo: Value error, repo 'widgets' must be 'owner/name'"),
        (json.dumps(task(FAIL_TO_PASS=[])), "FAIL_TO_PASS is empty"),
        (json.dumps(task(instance_id="../etc")), "instance_id '../etc' must be letters"),
        (json.dumps(task()) + "\n" + json.dumps(task()), "line 2: instance_id acme__widgets-1 appears twice"),
        ("", "holds no tasks"),
    ],
)
def test_bad_task_files_name_the_line_and_the_field(tmp_path: Path, content: str, message: str):
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as error:
        load_tasks(path)
    assert "\n" not in str(error.value)


def test_missing_sources_and_ids(tmp_path: Path):
    with pytest.raises(ConfigError, match="no task file or dataset at"):
        load_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidRequest, match="has no task nope"):
        load_tasks(EXAMPLES, ids=["nope"])


def test_a_local_hugging_face_dataset_folder(tmp_path: Path):
    """The hub cannot be reached here; a dataset saved to disk takes the same loading path."""
    import datasets

    rows = [task(FAIL_TO_PASS=json.dumps(["t::a"]), PASS_TO_PASS=json.dumps([]))]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    assert load_tasks(tmp_path / "saved")[0].fail_to_pass == ["t::a"]
    with pytest.raises(ConfigError, match="has no split 'dev'"):
        load_tasks(tmp_path / "saved", split="dev")
    parquet = tmp_path / "hub-like" / "data"
    parquet.mkdir(parents=True)
    datasets.Dataset.from_list(rows).to_parquet(str(parquet / "test-00000-of-00001.parquet"))
    assert load_tasks(tmp_path / "hub-like")[0].instance_id == "acme__widgets-1"


def test_a_csv_dataset_folder_keeps_versions_as_the_dataset_writes_them(tmp_path: Path):
    """A CSV reader takes `3.10` for the number 3.1 and `0.20` for 0.2: versions are read as text.
    A version that reached Orchard as a number (a JSON row) is its text."""
    import csv

    folder = tmp_path / "csv" / "data"
    folder.mkdir(parents=True)
    with (folder / "test.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[*task(), "version"])
        writer.writeheader()
        for index, version in enumerate(["3.1", "3.10", "0.20", "1.12"]):
            row = {**task(instance_id=f"acme__widgets-{index}"), "version": version}
            writer.writerow(
                {key: json.dumps(value) if isinstance(value, list) else value for key, value in row.items()}
            )
    assert [t.version for t in load_tasks(tmp_path / "csv")] == ["3.1", "3.10", "0.20", "1.12"]
    numeric = tmp_path / "tasks.jsonl"
    numeric.write_text(json.dumps(task(version=3.1)))
    assert load_tasks(numeric)[0].version == "3.1"


def test_diff_parsing():
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\ndiff --git a/old.py b/new.py\n"
    assert touched_files(diff) == ["x.py", "old.py", "new.py"]


def test_more_bad_sources_are_one_line(tmp_path: Path):
    binary = tmp_path / "tasks.parquet"
    binary.write_bytes(b"PAR1\x00\xff")
    with pytest.raises(ConfigError, match=r"give tasks as \.json or \.jsonl"):
        load_tasks(binary)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot load a dataset from"):
        load_tasks(tmp_path / "empty")
    shell = tmp_path / "shell.jsonl"
    shell.write_text(json.dumps(task(base_commit="abc; rm -rf /")))
    with pytest.raises(ConfigError, match="base_commit 'abc; rm -rf /' must be a commit id"):
        load_tasks(shell)
