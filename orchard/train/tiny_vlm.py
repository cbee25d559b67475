"""A tiny vision-language model built offline from a config: for tests, the GUI demo and CPU-only machines.

The architecture is Qwen2-VL's (a ViT with 14-pixel patches whose 2x2 neighbours are merged into
one token, fed to a Qwen2 decoder with multimodal RoPE), so the tiny model goes through the same
code as a real Qwen-VL student: `image_grid_thw`, `mm_token_type_ids`, one `<|image_pad|>` per
merged patch. Weights are random. The tokenizer is the tiny text model's (`orchard.train.tiny`:
byte-level BPE learnt from text at hand, here with the browser harnesses' prompts and tools too)
plus Qwen2-VL's vision tokens; the chat template is the tiny model's ChatML with image content
parts rendered as `<|vision_start|><|image_pad|><|vision_end|>` (`{% generation %}` kept, so
assistant turns can be located for SFT labels).

Screenshots are resized to at most `MAX_PIXELS` pixels (a 1280x1000 viewport becomes 308x224:
22x16 = 352 patches, 88 image tokens), so a forward pass with a screenshot takes milliseconds on
a CPU. The folder loads with `AutoModelForImageTextToText`, `AutoTokenizer` and
`AutoImageProcessor`; `AutoProcessor` too where torchvision is installed (transformers 5.24 builds
no Qwen-VL processor without it, even for images alone: its video processor needs torchvision),
which is why Orchard's own code (`orchard.agents.vision.load_processor`) takes the tokenizer and
the image processor separately.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

from orchard.errors import ConfigError
from orchard.train import tiny

VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
"""Qwen2-VL's vision tokens: an image is rendered as start, one pad per merged patch, end (the
video pad is there because Qwen-VL processors and configs name one)."""
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
"""What the chat template writes for an image part; the pad is expanded to the image's tokens."""

PATCH = 14
MERGE = 2
MIN_PIXELS = 4 * (PATCH * MERGE) ** 2
"""Smaller images are scaled up to this (2x2 merged tokens)."""
MAX_PIXELS = 100 * (PATCH * MERGE) ** 2
"""Larger images are scaled down to at most this many pixels (78,400), sides multiples of 28: a
1280x1000 screenshot becomes 308x224, 352 patches, 88 image tokens."""

_CONTENT = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type == 'image_url' -%}" + IMAGE + "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)


def _with_images(template: str) -> str:
    """The tiny model's chat template with every message content rendered through `render_content`
    (text, or content parts with images)."""
    rendered = (
        template.replace("{{ messages[0].content }}", "{{ render_content(messages[0].content) }}")
        .replace("{{ message.content or '' }}", "{{ render_content(message.content) }}")
        .replace("{{ message.content }}", "{{ render_content(message.content) }}")
    )
    if ".content }}" in rendered or ".content or" in rendered:
        raise AssertionError("orchard.train.tiny.CHAT_TEMPLATE renders a content this module does not know")
    return _CONTENT + rendered


CHAT_TEMPLATE = _with_images(tiny.CHAT_TEMPLATE)


def default_corpus() -> list[str]:
    """The tiny text model's corpus and the prompts and tools of every harness that shows the model
    a live page (one with an `opening`, `orchard.agents.base.Harness`): a browser's."""
    from orchard.agents import HARNESSES, harness_factory

    texts = tiny.default_corpus()
    for name in HARNESSES:
        make = harness_factory(name)
        if hasattr(make, "opening"):
            harness = make()
            texts += [harness.system_prompt({}), json.dumps(harness.tools())]
    return texts


def build_tiny_vlm(
    folder: str | Path,
    *,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    vision_depth: int = 2,
    vision_embed_dim: int = 32,
    vision_heads: int = 2,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    max_positions: int = 8192,
    seed: int = 0,
) -> Path:
    """Write a tokenizer, an image processor and a randomly initialised Qwen2-VL model to `folder`;
    return it. `hidden_size / heads` must be a multiple of 4 (multimodal RoPE splits it in three)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLConfig, Qwen2VLImageProcessorPil

    out = Path(folder).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} is not an empty folder; choose a new folder for the model")
    head_dim = hidden_size // heads
    if hidden_size % heads or head_dim % 4:
        raise ConfigError(f"hidden_size {hidden_size} / heads {heads} must be a whole multiple of 4")
    with tempfile.TemporaryDirectory() as scratch:
        # The tiny text model's tokenizer, learnt the same way (its throwaway model is some 40 KB).
        texts = list(corpus) if corpus is not None else default_corpus()
        tiny.build_tiny_model(
            Path(scratch) / "text",
            corpus=texts,
            vocab_size=vocab_size,
            hidden_size=4,
            layers=1,
            heads=1,
            max_positions=max_positions,
        )
        tokenizer = AutoTokenizer.from_pretrained(Path(scratch) / "text")
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {token: int(tokenizer.convert_tokens_to_ids(token)) for token in VISION_TOKENS}  # type: ignore[arg-type]
    half = head_dim // 2  # rotary frequencies per head, split over time, height and width as Qwen's 16/24/24
    side = half * 3 // 8
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 4,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "max_position_embeddings": max_positions,
            "rope_parameters": {"rope_type": "default", "mrope_section": [half - 2 * side, side, side]},
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_embed_dim,
            "num_heads": vision_heads,
            "hidden_size": hidden_size,  # what the merger hands the decoder
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    images = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    images.save_pretrained(out)
    return out
