"""Slack's checks of what a message or a view holds, as its Web API makes them: the one owner of the emulator's
content rules.

Blocks and views are parsed with slack_sdk's models (`Block.parse_all`, `View`), whose `to_dict()` checks every
limit Slack documents for a block and its elements, at every depth (a header's text over 150 characters, a
button's over 75, its value over 2,000, an action_id or block_id over 255, more than 25 elements in an actions
block or 10 in a context block, a section with neither text nor fields, …). What the models leave out is checked
here: a block type the models do not know, the number of blocks a message may hold, a message's text length.

Each check answers Slack's `[ERROR] …` lines (empty when all is well); the emulator answers them under Slack's
error name (`invalid_blocks` for a message, `invalid_arguments` for a view).
"""

from __future__ import annotations

from typing import Any

from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100  # a Home tab, a modal
MAX_MESSAGE_TEXT = 40_000  # chat.postMessage's msg_too_long
MAX_UPDATE_TEXT = 4_000  # chat.update's msg_too_long ("The text field cannot exceed 4,000 characters")
MAX_MARKDOWN_TEXT = 12_000  # markdown_text, in a post, an edit or a stream's call ("Limit this field to 12,000")


def too_many_blocks(blocks: Any, limit: int = MAX_MESSAGE_BLOCKS) -> bool:
    return isinstance(blocks, list) and len(blocks) > limit


def block_problems(blocks: Any, where: str = "/blocks", limit: int = MAX_MESSAGE_BLOCKS) -> list[str]:
    """What Slack says of a list of blocks: nothing when it takes them."""
    if not isinstance(blocks, list):
        return [f"[ERROR] must be an array [json-pointer:{where}]"]
    problems = []
    if len(blocks) > limit:
        problems.append(f"[ERROR] no more than {limit} items allowed [json-pointer:{where}]")
    for i, block in enumerate(blocks):
        problem = _block_problem(block)
        if problem is not None:
            problems.append(f"[ERROR] {problem} [json-pointer:{where}/{i}]")
    return problems


def view_problems(view: Any) -> list[str]:
    """What Slack says of a view (views.publish, views.open, views.update): nothing when it takes it."""
    if not isinstance(view, dict) or view.get("type") not in ("home", "modal"):
        return ["[ERROR] must provide a view of type home or modal [json-pointer:/view/type]"]
    problems = block_problems(view.get("blocks") or [], "/view/blocks", MAX_VIEW_BLOCKS)
    if problems:
        return problems
    try:
        View(**view).to_dict()  # the view's own fields: a modal's title, submit, close, private_metadata …
    except (SlackObjectFormationError, TypeError, ValueError, AttributeError) as exc:
        return [f"[ERROR] {exc} [json-pointer:/view]"]
    return []


def _block_problem(block: Any) -> str | None:
    if not isinstance(block, dict):
        return "must be an object"
    try:
        [parsed] = Block.parse_all([block])
        if parsed is None:  # the models know every type Slack does; they answer None for the others
            return f"unsupported type: {block.get('type')!r}"
        parsed.to_dict()  # checks the block and every element in it
    except SlackObjectFormationError as exc:
        return str(exc)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of the wrong shape
        return f"invalid block: {exc}"
    return None


MAX_PROMPTS = 4  # assistant.threads.setSuggestedPrompts: "Each prompt … up to four"


def prompt_problems(prompts: Any, title: Any = None) -> list[str]:
    """What Slack says of assistant.threads.setSuggestedPrompts' `prompts` (1 to 4, each a title and a message)
    and its optional `title` (a string)."""
    if not isinstance(prompts, list) or not 1 <= len(prompts) <= MAX_PROMPTS:
        return [f"[ERROR] must provide between 1 and {MAX_PROMPTS} items [json-pointer:/prompts]"]
    problems = []
    for i, prompt in enumerate(prompts):
        for name in ("title", "message"):
            if not isinstance(prompt, dict) or not isinstance(prompt.get(name), str) or not prompt[name]:
                problems.append(f"[ERROR] missing required field: {name} [json-pointer:/prompts/{i}]")
    if title is not None and not isinstance(title, str):
        problems.append("[ERROR] must be a string [json-pointer:/title]")
    return problems
