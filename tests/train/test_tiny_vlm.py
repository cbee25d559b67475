"""The tiny vision-language model: built offline, loaded by the Auto classes, generating from a real
PNG screenshot, its SFT labels checked token by token, and TRL training it with images in the batch."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

from orchard.train.config import SFTConfig
from orchard.train.sft import IGNORE

CLICK = {
    "type": "function",
    "function": {
        "name": "click",
        "description": "Click a point.",
        "parameters": {"type": "object", "properties": {"point_2d": {"type": "array"}}, "required": ["point_2d"]},
    },
}
TOOLS = [CLICK]
TOKENS_PER_SCREENSHOT = 88
"""A 1280x1000 screenshot resized to 308x224: 22x16 patches of 14 px, merged 2x2."""


def screenshot(label: str, color: str = "steelblue") -> str:
    """A 1280x1000 page with a button, as the browser harness sends it: a PNG data URL."""
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (1280, 1000), "white")
    draw = ImageDraw.Draw(page)
    draw.rectangle([0, 0, 1280, 60], fill="lightgray")
    draw.rectangle([540, 460, 740, 540], fill=color)
    draw.text((560, 490), label, fill="white")
    buffer = io.BytesIO()
    page.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def click(call_id: str, x: int, y: int) -> dict:
    arguments = json.dumps({"point_2d": [x, y]})
    return {"id": call_id, "type": "function", "function": {"name": "click", "arguments": arguments}}


def conversation(first: str, second: str) -> list[dict]:
    """Two turns of a browser episode: each after its own screenshot."""
    return [
        {"role": "system", "content": "You use a web browser."},
        {"role": "user", "content": [{"type": "text", "text": "TASK-TEXT press OK"}, image_part(screenshot(first))]},
        {"role": "assistant", "content": "FIRST-click", "tool_calls": [click("c0", 500, 500)]},
        {"role": "tool", "tool_call_id": "c0", "content": "FEEDBACK-ONE clicked a button"},
        {"role": "user", "content": [{"type": "text", "text": "TABS-LINE"}, image_part(screenshot(second, "green"))]},
        {"role": "assistant", "content": "SECOND-click", "tool_calls": [click("c1", 510, 490)]},
        {"role": "tool", "tool_call_id": "c1", "content": "FEEDBACK-TWO"},
    ]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    from orchard.train.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("models") / "vlm")


@pytest.fixture(scope="module")
def processor(vlm):
    from orchard.agents.vision import load_processor

    return load_processor(vlm)


def test_the_folder_loads_with_the_auto_classes(vlm, processor):
    from transformers import AutoModelForImageTextToText

    from orchard.agents.vision import holds_image_processor
    from orchard.train.tiny_vlm import IMAGE, VISION_TOKENS

    model = AutoModelForImageTextToText.from_pretrained(vlm)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert model.config.vision_config.patch_size == 14 and model.config.vision_config.spatial_merge_size == 2
    assert model.config.text_config.hidden_size == 64 and model.config.text_config.num_hidden_layers == 2
    assert sum(p.numel() for p in model.parameters()) < 500_000
    tokenizer = processor.tokenizer
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert all(len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1 for token in VISION_TOKENS)
    text = tokenizer.apply_chat_template(conversation("OK", "OK")[:3], tools=TOOLS, tokenize=False)
    assert "TASK-TEXT press OK" + IMAGE in text and '"name": "click"' in text and "<tool_call>" in text
    assert holds_image_processor(vlm) and not holds_image_processor(vlm / "missing")
    if importlib.util.find_spec("torchvision") is not None:  # where a Qwen-VL processor can be built at all
        from transformers import AutoProcessor

        from orchard.agents.vision import expand_image_pads, image_tokens, png_data, png_image

        real = AutoProcessor.from_pretrained(vlm)
        messages = conversation("OK", "OK")[:2]
        image = png_image(png_data(messages[1]["content"][1]["image_url"]["url"]))
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ours = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        theirs = real(text=[text], images=[image])["input_ids"][0]
        assert expand_image_pads(processor, list(ours), image_tokens(processor, [image])) == list(theirs)


def test_a_reply_from_a_screenshot_counts_its_image_tokens(vlm, processor):
    from orchard.agents.base import Reply
    from orchard.agents.loop import in_context
    from orchard.agents.models import ModelError
    from orchard.agents.vision import VisionModel

    model = VisionModel(str(vlm), max_new_tokens=6, max_images=1)
    messages = conversation("OK", "Next")[:2]
    reply = model.complete(messages, TOOLS)
    assert isinstance(reply, Reply) and reply.completion_tokens > 0

    def text_tokens(conversation: list[dict]) -> int:
        rendered = processor.tokenizer.apply_chat_template(
            conversation, tools=TOOLS, add_generation_prompt=True, return_dict=True
        )
        return len(rendered["input_ids"])

    assert reply.prompt_tokens == text_tokens(messages) - 1 + TOKENS_PER_SCREENSHOT  # the pad, expanded
    two = conversation("OK", "Next")[:5]  # two screenshots; the model keeps the newest, the other is a line
    assert model.complete(two, TOOLS).prompt_tokens == text_tokens(in_context(two, 1)) - 1 + TOKENS_PER_SCREENSHOT

    def user_sees(url: str) -> list[dict]:
        return [{"role": "user", "content": [image_part(url)]}]

    from PIL import Image

    wide, small = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (4097, 8)).save(wide, "PNG")
    Image.effect_noise((64, 64), 50).save(small, "PNG")
    for url, refusal in [
        ("data:image/jpeg;base64,/9j/4AAQ", "no inline PNG"),
        ("https://example.com/page.png", "no inline PNG"),
        ("data:image/png;base64," + base64.b64encode(b"GIF89a, not a PNG").decode(), "no PNG"),
        ("data:image/png;base64," + base64.b64encode(small.getvalue()[:300]).decode(), "broken PNG"),
        ("data:image/png;base64," + base64.b64encode(wide.getvalue()).decode(), "4097x8, over 4096"),
        ("data:image/png;base64," + "A" * (math.ceil(16 * 2**20 / 3) * 4 + 4), "over 16 MiB"),
    ]:
        with pytest.raises(ModelError, match=refusal):
            model.complete(user_sees(url), None)


def test_labels_cover_the_assistant_turns_and_never_an_image(processor, tmp_path):
    from orchard.agents.loop import load_images, store_images
    from orchard.errors import ConfigError
    from orchard.train.vision_sft import vision_examples

    tokenizer = processor.tokenizer
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    messages = conversation("OK", "Next")

    def trained(example: dict) -> str:
        return tokenizer.decode([label for label in example["labels"] if label != IGNORE])

    # The harness keeps one screenshot: each turn learns with the one it saw.
    first, second = vision_examples(processor, messages, TOOLS, keep_images=1)
    for example in (first, second):
        ids, labels = example["input_ids"], example["labels"]
        assert len(ids) == len(labels) and len(example["screenshots"]) == 1
        assert [i for i, t in enumerate(ids) if t == pad] == [
            i for i, t in enumerate(ids) if t == pad and labels[i] == IGNORE
        ]
        assert ids.count(pad) == TOKENS_PER_SCREENSHOT
        assert all(label in (IGNORE, token) for token, label in zip(ids, labels, strict=True))
    assert trained(first).startswith("FIRST-click<tool_call>") and trained(first).endswith("<|im_end|>\n")
    assert trained(second).startswith("SECOND-click") and "FIRST-click" not in trained(second)
    assert "[an earlier screenshot, no longer shown]" in tokenizer.decode(second["input_ids"])
    for example in (first, second):
        for marker in ("TASK-TEXT", "TABS-LINE", "FEEDBACK-ONE", "You use a web browser", '"description"'):
            assert marker not in trained(example)  # the task and the observations never carry loss

    # Every screenshot kept: one example, both turns trained, both images in.
    (whole,) = vision_examples(processor, messages, TOOLS, keep_images=None)
    assert whole["input_ids"].count(pad) == 2 * TOKENS_PER_SCREENSHOT and len(whole["screenshots"]) == 2
    assert "FIRST-click" in trained(whole) and "SECOND-click" in trained(whole)
    (only_second,) = vision_examples(processor, messages, TOOLS, trained_turns={1}, keep_images=None)
    assert trained(only_second).startswith("SECOND-click") and "FIRST-click" not in trained(only_second)
    assert vision_examples(processor, messages, TOOLS, trained_turns=set(), keep_images=None) == []

    # A cut inside the second image moves before it: no image is ever split.
    second_image = [i for i, t in enumerate(whole["input_ids"]) if t == pad][TOKENS_PER_SCREENSHOT]
    (cut,) = vision_examples(processor, messages, TOOLS, max_length=second_image + 10, keep_images=None)
    assert cut["input_ids"].count(pad) == TOKENS_PER_SCREENSHOT and len(cut["screenshots"]) == 1
    assert len(cut["input_ids"]) == second_image - 1  # before <|vision_start|>
    assert vision_examples(processor, messages, TOOLS, max_length=50, keep_images=None) == []  # no turn left

    # A stored trajectory names its screenshots by file: loaded again, they train the same.
    stored = store_images(messages, tmp_path / "images")
    with pytest.raises(ConfigError, match="load_images first"):
        vision_examples(processor, stored, TOOLS, keep_images=1)
    assert vision_examples(processor, load_images(stored), TOOLS, keep_images=1) == [first, second]


def test_sft_trains_the_tiny_vlm_on_screenshots_with_trl(vlm, processor, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    from orchard.agents.vision import VisionModel
    from orchard.train.vision_sft import train_vision_sft, vision_examples

    before = {k: v.clone() for k, v in AutoModelForImageTextToText.from_pretrained(vlm).state_dict().items()}
    examples = [
        example
        for first, second in (("OK", "Next"), ("Go", "Done"))
        for example in vision_examples(processor, conversation(first, second), TOOLS, keep_images=1)
    ]
    assert len(examples) == 4
    settings = SFTConfig(max_steps=2, batch_size=2, learning_rate=1e-2, max_length=4096)
    result = train_vision_sft(vlm, examples, tmp_path / "sft", settings)
    assert result["steps"] == 2 and result["screenshots"] == 4
    assert len(result["losses"]) == 2 and all(math.isfinite(loss) and loss > 0 for loss in result["losses"])
    after = AutoModelForImageTextToText.from_pretrained(tmp_path / "sft").state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("visual.patch_embed" in k for k in moved)  # the screenshots' pixels reached the loss
    assert any("language_model" in k for k in moved)
    trained = VisionModel(str(tmp_path / "sft"), max_new_tokens=4)
    assert trained.complete(conversation("OK", "Next")[:2], TOOLS).prompt_tokens > TOKENS_PER_SCREENSHOT
