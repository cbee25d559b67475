"""A picture in any terminal: an image drawn with half blocks, two pixels a cell (`▀`, its top pixel
the foreground colour, its bottom one the background), so a screenshot shows in the TUI without a
terminal graphics protocol. Textual lowers the colours to what the terminal has (and to none under
`NO_COLOR`, where the path beside it is what is left to go by)."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from rich.text import Text

MAX_PIXELS = 4096 * 4096
"""The largest image drawn (a bigger one, or one that does not decode, is named, not drawn)."""


def half_blocks(path: str | Path, width: int = 80) -> Text:
    """The image at `path` scaled to `width` cells (its aspect kept), or a line saying why not."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.width * image.height > MAX_PIXELS:
                return Text(f"[{path}: {image.width}x{image.height} is too large to draw]")
            height = max(2, round(image.height * width / image.width / 2) * 2)
            rgb = image.convert("RGB").resize((width, height))
            pixels = [rgb.getpixel((x, y)) for y in range(height) for x in range(width)]
    except Image.DecompressionBombError:  # past PIL's own pixel bound, before ours is asked
        return Text(f"[{path}: the image is too large to draw]")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        return Text(f"[{path}: cannot be drawn: {exc}]")
    picture = Text()
    for y in range(0, height, 2):
        for x in range(width):
            top, bottom = pixels[y * width + x], pixels[(y + 1) * width + x]
            picture.append("▀", Style(color=f"rgb{top}", bgcolor=f"rgb{bottom}"))
        picture.append("\n")
    return picture
