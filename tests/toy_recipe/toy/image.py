"""The image word-count tasks run in: the static busybox image and `FILES` under `/data`, no Python."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from contextlib import closing

IMAGE = "orchard/toy:words"
FILES = {
    "fruit.txt": "apple banana cherry\n",
    "poem.txt": "the cat sat on the mat\nand then it sat again\n",
    "one.txt": "hello\n",
}


def build_image(*, force: bool = False, log: Callable[[str], None] | None = None) -> str:
    """Build (or reuse) `IMAGE` from the busybox image, offline (`docker build` of a local base)."""
    from orchard.env import images

    base = images.build_busybox()
    with closing(images.docker_client()) as client, images.build_lock(IMAGE):
        if force or not images.image_exists(IMAGE):
            context = io.BytesIO()
            with tarfile.open(fileobj=context, mode="w") as tar:
                dockerfile = f"FROM {base}\nCOPY data /data\n"
                for name, text in {"Dockerfile": dockerfile, **{f"data/{n}": t for n, t in FILES.items()}}.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(text.encode())
                    tar.addfile(info, io.BytesIO(text.encode()))
            context.seek(0)
            client.images.build(fileobj=context, custom_context=True, tag=IMAGE, pull=False, rm=True)
            (log or images.quiet)(f"built {IMAGE}")
    return IMAGE
