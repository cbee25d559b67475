"""A gui task's site served where the image has no Python: `GuiTask.serve` starts the site's server
on the bundle's interpreter, here in sandboxes of the static busybox image (no Python, no libc);
its pages answer, its log comes back behind the token, and the host's replay grades it. No browser:
the requests are sent through the exec agent, as Chromium's would be; the script that starts
Chromium runs on the bundle's interpreter too."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode

import pytest

from orchard.recipes.gui.browser import start_command
from orchard.recipes.gui.task import SITE_PORT, GuiTask
from orchard.tasks.loading import load_tasks

EXAMPLES = Path(__file__).parents[2] / "examples" / "gui" / "tasks.json"
TASKS = {task.instance_id: task for task in load_tasks(EXAMPLES) if isinstance(task, GuiTask)}
SITES = {"shop": "gui-shop-rain-jacket", "wiki": "gui-wiki-on-call", "booking": "gui-booking-friday-dinner"}
PROCESSES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.mark.parametrize("site", sorted(SITES))
def test_every_site_serves_in_an_image_without_python(client, busybox_image, site):
    task = TASKS[SITES[site]]
    assert Path(task.site).stem == site
    with client.create(busybox_image, network="blocked") as box:
        assert box.exec("which python3 || which python").exit_code != 0
        task.serve(box)
        page = box.http(task.start_path, port=SITE_PORT, method="GET")
        assert page.status == 200 and page.body.startswith(b"<!doctype html>"), page.body[:300]
        server = [line for line in box.exec(PROCESSES).stdout.splitlines() if " site.py app.py " in line]
        assert len(server) == 1 and "/.orchard/bin/python3 -s -S -B site.py app.py " in server[0], server


def test_a_booking_made_in_an_image_without_python_grades_resolved(client, busybox_image):
    task = TASKS["gui-booking-friday-dinner"]
    form = {
        "date": "2026-03-06",
        "time": "19:30",
        "party": "4",
        "name": "Ana Lopez",
        "email": "ana.lopez@example.com",
        "notes": "One of us is vegetarian.",
    }
    with client.create(busybox_image, network="blocked") as box:
        task.serve(box)
        booked = box.http(
            "/book",
            port=SITE_PORT,
            body=urlencode(form),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert booked.status == 303, booked.body[:300]
        submission = task.finish(box, None, "Your booking code is LB-WRF3.", [])
    assert [(c["endpoint"], c["status"]) for c in json.loads(submission)["log"]] == [("/book", 200)]
    grade = task.grade(None, submission)
    assert grade.resolved and grade.score == 1.0, grade.checks


def test_the_browsers_start_script_runs_in_an_image_without_python(client, busybox_image):
    """`start_command` runs its script on the bundle's interpreter too: in an image with neither
    Python nor Chromium, the script itself says that Chromium could not start."""
    with client.create(busybox_image, network="blocked") as box:
        started = box.exec(start_command((800, 600), wait=1), timeout=30)
    assert started.exit_code == 1, started
    assert started.stdout.startswith("it could not start\n"), started.stdout + started.stderr
