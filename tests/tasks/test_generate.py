"""examples/tasks/generate.py: seeded tasks with one bug each, a training and a held-out set that
share no name, file or number, and gold patches the real grader resolves."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
KINDS = {"off_by_one", "wrong_operator", "inverted_condition", "wrong_constant", "missing_case", "wrong_variable"}


def generate(dest: Path, train: int, held_out: int, seed: int) -> dict[str, list[dict]]:
    """Run the generator as a user does; returns {split: rows}."""
    command = [sys.executable, str(EXAMPLES / "generate.py"), str(dest), "--train", str(train)]
    command += ["--held-out", str(held_out), "--seed", str(seed)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return {split: rows_of(dest / f"{split}.jsonl") for split in ("train", "held-out")}


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def files_of(diff: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) ", diff, re.MULTILINE)


def head(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """12 training and 6 held-out tasks: every bug kind twice, and once."""
    dest = tmp_path_factory.mktemp("generated")
    return dest, generate(dest, 12, 6, seed=3)


def test_the_same_seed_makes_the_same_bytes_and_commits_whatever_the_count(generated, tmp_path: Path):
    dest, rows = generated
    assert generate(tmp_path / "again", 12, 6, seed=3) == rows
    for split in rows:
        assert (tmp_path / "again" / f"{split}.jsonl").read_bytes() == (dest / f"{split}.jsonl").read_bytes()
    for row in rows["train"] + rows["held-out"]:
        folder = row["repo"].replace("/", "__")
        assert head(tmp_path / "again" / folder) == head(dest / folder) == row["base_commit"] + "\n"
    fewer = generate(tmp_path / "fewer", 4, 2, seed=3)
    assert fewer == {"train": rows["train"][:4], "held-out": rows["held-out"][:2]}
    other = generate(tmp_path / "other", 4, 2, seed=4)
    assert [r["base_commit"] for r in other["train"]] != [r["base_commit"] for r in fewer["train"]]


def vocabulary(dest: Path, rows: list[dict]) -> dict[str, set]:
    """What a set names and numbers: module and test files, functions, parameters, module-level
    constants, numbers (but 0 and 1) and the strings functions return, from the repositories' modules."""
    found: dict[str, set] = {
        key: set() for key in ("files", "functions", "parameters", "constants", "numbers", "labels")
    }
    for row in rows:
        module = files_of(row["patch"])[0]
        found["files"] |= {module, *files_of(row["test_patch"])}
        tree = ast.parse((dest / row["repo"].replace("/", "__") / module).read_text())
        documented = [node for node in ast.walk(tree) if isinstance(node, ast.Module | ast.FunctionDef)]
        docstrings = {id(node.body[0].value) for node in documented if ast.get_docstring(node)}  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                found["functions"].add(node.name)
                found["parameters"] |= {arg.arg for arg in node.args.args}
            elif isinstance(node, ast.Assign) and node in tree.body:
                found["constants"] |= {target.id for target in node.targets if isinstance(target, ast.Name)}
            elif isinstance(node, ast.Constant) and id(node) not in docstrings:
                if isinstance(node.value, str):
                    found["labels"].add(node.value)
                elif isinstance(node.value, int) and node.value not in (0, 1):
                    found["numbers"].add(node.value)
    return found


def test_held_out_shares_no_task_repository_file_name_or_number_with_train(generated):
    dest, rows = generated
    train, held_out = rows["train"], rows["held-out"]
    for key in ("instance_id", "repo", "workdir"):
        assert not {r[key] for r in train} & {r[key] for r in held_out}, key
    seen, unseen = vocabulary(dest, train), vocabulary(dest, held_out)
    for key, names in seen.items():
        assert not names & unseen[key], f"{key} shared: {sorted(names & unseen[key])}"
    assert all(seen[key] and unseen[key] for key in ("files", "functions", "parameters", "numbers"))
    modules = {Path(name).stem for name in seen["files"] | unseen["files"] if "/" not in name}
    assert not modules & sys.stdlib_module_names  # the tests' `import <module>` finds the task's own


def test_every_kind_in_each_set_and_each_task_is_one_small_fix_the_issue_does_not_give(generated):
    dest, rows = generated
    for split, split_rows in rows.items():
        assert {row["bug_kind"] for row in split_rows} == KINDS, split
    for row in rows["train"] + rows["held-out"]:
        repo = dest / row["repo"].replace("/", "__")
        module = files_of(row["patch"])[0]
        assert "/" not in module and len((repo / module).read_text().splitlines()) <= 40
        assert files_of(row["test_patch"]) == [f"tests/test_{module}"]
        added = [line[1:].strip() for line in row["patch"].splitlines() if line[:1] == "+" and line[:3] != "+++"]
        assert 1 <= len(added) <= 2 and not any(line in row["problem_statement"] for line in added), row["patch"]
        assert "expected" in row["problem_statement"] and len(row["PASS_TO_PASS"]) == 3
        assert row["FAIL_TO_PASS"][0].startswith(f"tests/test_{module}::test_")


def test_the_checker_finds_the_new_test_failing_before_the_fix_and_everything_passing_after(generated):
    """check_tasks.py on generated repositories: pytest, not the generator's own evaluation."""
    dest, rows = generated
    ids = [rows["train"][0]["instance_id"], rows["train"][3]["instance_id"]]
    command = [sys.executable, str(EXAMPLES / "check_tasks.py"), "--tasks", str(dest / "train.jsonl")]
    command += ["--repos", str(dest), *(f"--only={i}" for i in ids)]
    checked = subprocess.run(command, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 tasks checked: 2 passed, 0 failed; 0 general problems" in checked.stdout


def test_the_grader_resolves_gold_patches_and_not_an_empty_one_or_a_comment(generated, client, base_image):
    from orchard.recipes.swe.environments import RepoMirror, task_image
    from orchard.recipes.swe.grading import grade_patch
    from orchard.tasks import load_tasks

    dest, rows = generated
    mirror = RepoMirror(dest)
    picked = [rows["train"][1]["instance_id"], rows["held-out"][2]["instance_id"]]
    tasks = load_tasks(dest / "train.jsonl", ids=picked[:1]) + load_tasks(dest / "held-out.jsonl", ids=picked[1:])
    images = [task_image(task, mirror) for task in tasks]
    for task, image in zip(tasks, images, strict=True):
        grade = grade_patch(client, task, task.patch, image)
        assert grade.outcome == "resolved", (grade.error, grade.log[-2000:])
        assert grade.pass_to_pass["success"] == task.pass_to_pass
    task, image = tasks[0], images[0]
    assert grade_patch(client, task, "", image).outcome == "empty_patch"
    module = files_of(task.patch)[0]
    first = (dest / task.repo.replace("/", "__") / module).read_text().splitlines()[0]
    comment = (
        f"diff --git a/{module} b/{module}\n--- a/{module}\n+++ b/{module}\n@@ -1 +1,2 @@\n {first}\n+# reviewed\n"
    )
    grade = grade_patch(client, task, comment, image)
    assert grade.outcome == "unresolved" and grade.fail_to_pass["failure"] == task.fail_to_pass
    assert grade.pass_to_pass["success"] == task.pass_to_pass


def _fixed_by(commands: list[str], repo: Path, copy: Path) -> str:
    """The files of `repo` after running `commands` in a copy of it, as `git diff` shows them."""
    subprocess.run(["cp", "-a", f"{repo}/.", str(copy)], check=True)
    for command in commands:
        subprocess.run(["bash", "-c", command], cwd=copy, check=True, capture_output=True)
    return subprocess.run(["git", "diff"], cwd=copy, check=True, capture_output=True, text=True).stdout


def test_scripted_sed_makes_exactly_the_gold_fix_of_every_task(generated, tmp_path: Path):
    """`scripted:sed` (the teacher of the learning run) edits lines by number; the result is the
    gold patch's, byte for byte, on every generated task, and a listing comes before each edit."""
    from orchard.recipes.swe.task import LISTING, SWETask, sed_script

    dest, rows = generated
    for row in rows["train"] + rows["held-out"]:
        task = SWETask.model_validate(row)
        steps = sed_script(task)
        assert [s.kind for s in steps] == ["bash", "bash", "submit"] and steps[0].command.startswith(LISTING)
        repo = dest / row["instance_id"]
        edits = [s.command for s in steps if s.kind == "bash" and s.command.startswith("sed ")]
        gold = _fixed_by([f"git apply <<'EOF'\n{row['patch']}EOF"], repo, tmp_path / f"{row['instance_id']}-gold")
        assert _fixed_by(edits, repo, tmp_path / row["instance_id"]) == gold, row["instance_id"]


def test_scripted_sed_covers_insertions_deletions_several_hunks_and_files(tmp_path: Path):
    from orchard.recipes.swe.task import SWETask, sed_script

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    (repo / "b.py").write_text("x = 'one'\ny = 2\n")
    subprocess.run(
        "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base",
        shell=True,
        cwd=repo,
        check=True,
    )
    (repo / "a.py").write_text(
        "head\n" + "".join(f"line {i}\n" for i in range(1, 21) if i not in (5, 6)).replace("line 15", "fifteen\\n")
    )
    (repo / "b.py").write_text("x = 'two'\ny = 2\nz = 3\n")
    patch = subprocess.run(["git", "diff"], cwd=repo, check=True, capture_output=True, text=True).stdout
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)
    task = SWETask(
        instance_id="o__r-1", repo="o/r", base_commit="0" * 40, problem_statement="p", patch=patch, FAIL_TO_PASS=["t"]
    )
    steps = sed_script(task)
    assert [s.command.split()[-1] for s in steps if s.kind == "bash"] == ["a.py", "a.py", "b.py", "b.py"]
    edits = [s.command for s in steps if s.kind == "bash" and s.command.startswith("sed ")]
    assert _fixed_by(edits, repo, tmp_path / "copy") == patch
