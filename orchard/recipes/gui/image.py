"""The image GUI tasks run in: the Debian base with Debian's Chromium and fonts, built offline."""

from __future__ import annotations

from orchard.env.images import DEFAULT_RELEASE, Log, build_base

IMAGE = "orchard/browser:bookworm"
PACKAGES = ("chromium", "fonts-dejavu-core", "fonts-liberation")
"""What the browser image adds to the base: Debian's Chromium (driven over CDP, no browser is
downloaded) and fonts, so pages render the same in every sandbox."""
CHROMIUM = "/usr/bin/chromium"


def build_image(tag: str = IMAGE, *, force: bool = False, mirror: str | None = None, log: Log | None = None) -> str:
    """Build (or reuse) the browser image: the bookworm base plus `PACKAGES` (about 900 MB, a
    minute or two the first time). Chromium runs inside the sandbox, its network `blocked`."""
    return build_base(tag, release=DEFAULT_RELEASE, force=force, mirror=mirror, log=log, extra=PACKAGES)
