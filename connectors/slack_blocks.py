"""Block Kit as Slack checks it, and as a reader sees it in plain text.

``block_errors`` enforces Slack's own limits (block count, text lengths, element kinds), so a
message Slack would refuse fails in tests and in the local Slack server too;
``render_terminal`` turns a message and its markup into what a reader sees, for the demo's
console.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from costline.connectors.slack_server import Channel, Message

Block = dict[str, Any]
MAX_BLOCKS = 50


def block_errors(blocks: Any) -> list[str]:
    """Slack's own Block Kit limits, so a message too wide for Slack fails here too."""
    if not isinstance(blocks, list):
        return ["must be an array [json-pointer:/blocks]"]
    errors = [] if len(blocks) <= MAX_BLOCKS else [
        f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]"]
    for index, block in enumerate(blocks):
        where = f"[json-pointer:/blocks/{index}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            errors.append(f"missing required field: type {where}")
            continue
        errors += [f"{problem} {where}" for problem in _block_problems(block)]
    return errors


def _text_problem(obj: Any, limit: int, plain_only: bool = False) -> str | None:
    if not isinstance(obj, dict) or obj.get("type") not in ("plain_text", "mrkdwn"):
        return "text must be a text object"
    if plain_only and obj["type"] != "plain_text":
        return "text must be plain_text"
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return "text must be a non-empty string"
    return f"must be less than {limit + 1} characters" if len(text) > limit else None


def _block_problems(block: Block) -> list[str]:
    kind = block["type"]
    found: list[str | None] = []
    if kind == "header":
        found.append(_text_problem(block.get("text"), 150, plain_only=True))
    elif kind == "section":
        if "text" not in block and "fields" not in block:
            found.append("section needs text or fields")
        if "text" in block:
            found.append(_text_problem(block["text"], 3000))
        fields = block.get("fields", [])
        if not isinstance(fields, list) or len(fields) > 10:
            found.append("fields: no more than 10 items allowed")
        else:
            found += [_text_problem(f, 2000) for f in fields]
        if "accessory" in block:
            found += _element_problems(block["accessory"])
    elif kind == "context":
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
            found.append("context needs 1 to 10 elements")
        else:
            found += [_text_problem(e, 3000) for e in elements if e.get("type") != "image"]
    elif kind == "actions":
        found += _actions_problems(block.get("elements"))
    elif kind not in ("divider", "image", "rich_text", "markdown", "input", "file", "video"):
        found.append(f"unsupported block type {kind!r}")
    return [problem for problem in found if problem]


def _actions_problems(elements: Any) -> list[str | None]:
    if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
        return ["actions needs 1 to 25 elements"]
    ids = [e.get("action_id") for e in elements if isinstance(e, dict)]
    found: list[str | None] = ["action_id must be unique in a block"] if len(
        set(ids)) != len(ids) else []
    for element in elements:
        found += _element_problems(element)
    return found


def _element_problems(element: Any) -> list[str | None]:
    if not isinstance(element, dict) or not isinstance(element.get("type"), str):
        return ["element needs a type"]
    found: list[str | None] = []
    if len(str(element.get("action_id", ""))) > 255:
        found.append("action_id must be less than 256 characters")
    if element["type"] == "button":
        found.append(_text_problem(element.get("text"), 75, plain_only=True))
        if len(str(element.get("value", ""))) > 2000:
            found.append("value must be less than 2001 characters")
    elif element["type"] == "overflow":
        options = element.get("options")
        if not isinstance(options, list) or not 2 <= len(options) <= 5:
            found.append("overflow needs 2 to 5 options")
        else:
            found += ["option value must be less than 151 characters"
                      for o in options if len(str(o.get("value", ""))) > 150]
    return found


SHORTCODES = {":warning:": "⚠️", ":rotating_light:": "🚨", ":information_source:": "ℹ️",
              ":white_check_mark:": "✅", ":no_bell:": "🔕", ":hourglass_flowing_sand:": "⏳",
              ":bell:": "🔔", ":chart_with_upwards_trend:": "📈", ":crystal_ball:": "🔮",
              ":repeat:": "🔁", ":raised_hand:": "✋", ":x:": "❌"}


def plain(mrkdwn: str) -> str:
    """Slack markup → what a reader sees: dates by their fallback, links by their label."""
    text = re.sub(r"<!date\^[^|>]*\|([^>]*)>", r"\1", mrkdwn)
    text = re.sub(r"<[^|>]*\|([^>]*)>", r"\1", text)
    for code, glyph in SHORTCODES.items():
        text = text.replace(code, glyph)
    text = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", text.replace("*", "").replace("`", ""))
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def block_lines(block: Block) -> list[str]:
    """A block as the lines a reader sees in a terminal."""
    kind = block.get("type")
    if kind == "header":
        return [plain(block["text"]["text"]).upper()]
    if kind == "section":
        lines = plain(block.get("text", {}).get("text", "")).splitlines()
        lines += [plain(f.get("text", "")) for f in block.get("fields", [])]
        if block.get("accessory", {}).get("type") == "overflow":
            lines[-1:] = [f"{lines[-1] if lines else ''}  [⋯]"]
        return lines
    if kind == "context":
        return [plain(e.get("text", "")) for e in block.get("elements", [])]
    if kind == "actions":
        return ["  ".join(f"[{plain(e.get('text', {}).get('text', e.get('type', '')))}]"
                          for e in block.get("elements", []))]
    return ["─" * 32] if kind == "divider" else []


def render_terminal(event: str, channel: Channel, message: Message) -> str:
    """A posted message as readable plain text, for the demo's console."""
    where = f"#{channel.name}" + (f" (thread {message.thread_ts})" if message.thread_ts else "")
    lines = [f"── {where} · {event} {message.ts} ──"]
    if message.blocks:
        for block in message.blocks:
            lines += block_lines(block)
    else:
        lines.append(plain(message.text))
    return "\n".join(lines)


def print_messages(event: str, channel: Channel, message: Message) -> None:
    print(render_terminal(event, channel, message) + "\n", flush=True)
