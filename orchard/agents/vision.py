"""A local vision-language model (Qwen-VL family) that works from screenshots: `VisionModel`.

It is `TransformersModel` (the same chat template use, tool-call format `<tool_call>{...}</tool_call>`
and parsing, sampling options) with images: each `image_url` content part of the conversation (an
inline `data:image/png;base64,...` URL, what the browser harness sends and `load_images` restores)
is decoded, checked and handed to the model with its placeholder tokens expanded, one
`<|image_pad|>` per merged patch, as Qwen2-VL, Qwen2.5-VL and Qwen3-VL processors do.

Bounds, each refused with a `ModelError` (the episode ends, as with a server's 413): an image part
that is no inline PNG, more than `MAX_IMAGE_BYTES` of PNG or more than `MAX_IMAGE_SIDE` pixels a
side (checked from the header, before decoding). Past `max_images` images, the older ones are
replaced by a line saying so (`in_context`), as a harness's `keep_images` does.

Why the tokenizer and the image processor are loaded apart (`load_processor`), not with
`AutoProcessor`: transformers 5.24 builds no Qwen-VL processor without torchvision, even for
images alone, and Orchard's CPU installs have none. The expansion it would do is a few lines here,
and the same lines build the SFT examples (`orchard.train.vision_sft`), so training and inference
tokenize a screenshot the same way.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.agents.base import Message, Reply
from orchard.agents.loop import in_context
from orchard.agents.models import ModelError, TransformersModel
from orchard.errors import ConfigError

if TYPE_CHECKING:
    from PIL.Image import Image

MAX_IMAGES = 4
"""Images a model is shown at most (the newest); the harness's `keep_images` is 1 by default."""
MAX_IMAGE_BYTES = 16 * 1024 * 1024
MAX_IMAGE_SIDE = 4096
PNG_URL = "data:image/png;base64,"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"


@dataclass
class VisionProcessor:
    """What a Qwen-VL processor holds that Orchard uses: the tokenizer (with the chat template) and
    the image processor. A transformers processor, where one can be built, serves as well."""

    tokenizer: Any
    image_processor: Any


def load_processor(path: str | Path) -> VisionProcessor:
    """The tokenizer and image processor of a model folder (or a hub id, with a network or the HF cache)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    try:
        return VisionProcessor(AutoTokenizer.from_pretrained(str(path)), AutoImageProcessor.from_pretrained(str(path)))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the processor of {path}: {str(exc).splitlines()[0]}") from None


def holds_image_processor(path: str | Path) -> bool:
    """Whether a model folder has an image processor (a vision-language model, for `hf:PATH`)."""
    folder = Path(path).expanduser()
    for name in ("preprocessor_config.json", "processor_config.json"):
        try:
            config = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and ("image_processor_type" in config or "image_processor" in config):
            return True
    return False


def png_data(url: str) -> bytes:
    """The PNG of an inline data URL (ValueError when it is none, or over `MAX_IMAGE_BYTES`)."""
    if not url.startswith(PNG_URL):
        shown = url[:40] + ("..." if len(url) > 40 else "")
        raise ValueError(f"an image part is no inline PNG ({shown!r}); stored images need load_images first")
    encoded = url[len(PNG_URL) :]
    if len(encoded) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise ValueError(f"an image is over {MAX_IMAGE_BYTES // 2**20} MiB")
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"an image part is no base64 ({exc})") from None


def png_image(data: bytes) -> Image:
    """A PNG decoded, its size checked from the header first (ValueError when it is no PNG, is
    broken, or is over `MAX_IMAGE_SIDE` pixels a side)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=["PNG"])
    except UnidentifiedImageError:
        raise ValueError("an image part is no PNG") from None
    except Image.DecompressionBombError as exc:  # over PIL's own pixel bound, before ours is asked
        raise ValueError(f"an image part is too large: {exc}") from None
    if max(image.size) > MAX_IMAGE_SIDE:
        raise ValueError(f"an image is {image.width}x{image.height}, over {MAX_IMAGE_SIDE} pixels a side")
    try:
        image.load()
    except (OSError, SyntaxError) as exc:  # a truncated or corrupt PNG
        raise ValueError(f"an image part is a broken PNG ({exc})") from None
    return image


def message_pngs(messages: list[Message]) -> list[bytes]:
    """The PNGs of a conversation's image parts, in the order the chat template renders them."""
    return [
        png_data(str((part.get("image_url") or {}).get("url", "")))
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    ]


def image_tokens(processor: Any, images: list[Image]) -> list[int]:
    """How many `<|image_pad|>` tokens each image takes: its merged patches after resizing."""
    merge = int(processor.image_processor.merge_size)
    return [
        int(processor.image_processor.get_number_of_image_patches(image.height, image.width, {})) // merge**2
        for image in images
    ]


def expand_image_pads(processor: Any, ids: list[int], counts: list[int]) -> list[int]:
    """Token ids with the i-th `<|image_pad|>` repeated `counts[i]` times (ValueError when the ids
    hold another number of images than `counts`)."""
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    if sum(1 for token in ids if token == pad) != len(counts):
        raise ValueError(
            f"the chat template rendered {sum(1 for t in ids if t == pad)} images, the messages hold {len(counts)}"
        )
    expanded: list[int] = []
    images = iter(counts)
    for token in ids:
        expanded.extend([pad] * next(images) if token == pad else [token])
    return expanded


def model_inputs(processor: Any, ids: list[list[int]], images: list[Image]) -> dict[str, Any]:
    """What a Qwen-VL model takes besides the ids (already expanded, one row each): the pixel values
    and patch grid of every image in order, and which tokens are image (1) or video (2) tokens."""
    import torch

    tokens = torch.tensor(ids)
    tokenizer = processor.tokenizer
    kinds = (tokens == tokenizer.convert_tokens_to_ids(IMAGE_PAD)).long()
    kinds += 2 * (tokens == tokenizer.convert_tokens_to_ids(VIDEO_PAD)).long()
    inputs: dict[str, Any] = {"mm_token_type_ids": kinds}
    if images:
        pixels = processor.image_processor(images=images, return_tensors="pt")
        inputs |= {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
    return inputs


class VisionModel(TransformersModel):
    """A Qwen-VL-family model from a folder (`orchard.train.tiny_vlm` builds a tiny one), generating
    from screenshots on this machine; or from a loaded `model` and `processor` (a policy in training)."""

    def __init__(
        self,
        path: str | None = None,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        max_images: int = MAX_IMAGES,
        model: Any = None,
        processor: Any = None,
        name: str | None = None,
    ):
        if model is None or processor is None:
            source = _source(path)
            processor, model = load_processor(source), _load_vision_lm(source)
            name = name or f"hf:{Path(source).name}"
        super().__init__(
            model=model,
            tokenizer=processor.tokenizer,
            name=name or "policy",
            generate=self._from_screenshots,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        self.processor, self.max_images = processor, max_images
        self._turn = threading.Lock()  # one conversation at a time: its images ride along to `generate`
        self._images: list[Image] = []
        self._prompt_tokens = 0

    @classmethod
    def from_spec(cls, argument: str, *, max_tokens: int = 256, temperature: float = 0.0, **_: Any) -> VisionModel:
        return cls(argument, max_new_tokens=max_tokens, temperature=temperature)

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        """`TransformersModel.complete` on the newest `max_images` images; the prompt's tokens
        count each image's tokens."""
        shown = in_context(messages, self.max_images)
        with self._turn:
            try:
                self._images = [png_image(data) for data in message_pngs(shown)]
            except ValueError as exc:
                raise ModelError(f"the model cannot take this conversation: {exc}") from None
            reply = super().complete(shown, tools)
            reply.prompt_tokens = self._prompt_tokens
        return reply

    def _from_screenshots(self, prompt_ids: list[int]) -> list[int]:
        """The `generate` of `TransformersModel`: prompt ids (one pad per image) to completion ids."""
        import torch

        try:
            ids = expand_image_pads(self.processor, prompt_ids, image_tokens(self.processor, self._images))
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}; its chat template must render image parts") from None
        self._prompt_tokens = len(ids)
        device = next(self.model.parameters()).device
        inputs = {key: value.to(device) for key, value in model_inputs(self.processor, [ids], self._images).items()}
        # plain temperature sampling, as TransformersModel
        sampling = (
            {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}
            if self.temperature > 0
            else {"do_sample": False}
        )
        with torch.no_grad():
            output = self.model.generate(
                input_ids=torch.tensor([ids], device=device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **inputs,
                **sampling,
            )
        return [int(t) for t in output[0][len(ids) :]]


def _source(path: str | None) -> str:
    """A model folder, or a hub id when the hub answers (ConfigError otherwise, one line)."""
    folder = Path(path or "").expanduser()
    if folder.is_dir():
        return str(folder)
    if path and re.fullmatch(r"[\w.-]+/[\w.-]+", path):
        from orchard.config import require_hub

        require_hub(path)
        return path
    raise ConfigError(f"no model folder at {path}")


def _load_vision_lm(source: str) -> Any:
    """An image-text-to-text model from a folder or hub id, on the GPU where there is one."""
    import torch
    from transformers import AutoModelForImageTextToText

    try:
        model: Any = AutoModelForImageTextToText.from_pretrained(source, dtype="auto")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load vision-language model {source}: {str(exc).splitlines()[0]}") from None
    if torch.cuda.is_available():
        model.to("cuda")
    return model.eval()
