"""What the GUI tests share: the browser image (built offline once, as the base image is) and a
real `blocked` sandbox of it, with the task sandboxes' memory limit, shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def browser_image(docker_client) -> str:
    """The browser image (the bookworm base, Debian's Chromium, fonts), built once if missing;
    CI builds it too, never skips."""
    from orchard.recipes.gui.image import build_image

    return build_image()


@pytest.fixture(scope="module")
def browser_box(client, browser_image) -> Iterator:
    """A `blocked` sandbox of the browser image, limited as a task's sandbox is."""
    from orchard.tasks.base import SANDBOX_LIMITS

    with client.create(browser_image, network="blocked", **SANDBOX_LIMITS) as box:
        yield box
