"""The approval message: one Block Kit message per gated call, built from its approvals row.

The worker posts it when a turn suspends; the bot rebuilds it from the same row once someone decides (or the
worker, once it expired), so the two sides show the same call the same way and only the last lines change:
while pending, who asked, until when, and the buttons; once decided, who decided what and when, and no
buttons. Everything from the call (its line, the command, the diff) is the model's or the repository's text:
it is scrubbed of the service's secrets and shown so that it can notify nobody.

What the approver sees is what runs (`layout` decides it, once, for the thread, App Home and the bot's checks):
the call's line names it (the head of its title, shown as written: inline code, so that the model's `*` and `~`
format nothing), and its whole text (the command, the diff) follows, inline when it is short (one code section,
at most INLINE_LINES lines, no long run of blank space), else as its head and its tail with a line saying what
lies between, which is only in a file of the whole text uploaded to the thread. That line and the file's title
carry the same fingerprint of what is shown (the row's digest), so a message and its file go together. Nothing
is cut off with an ellipsis that hides the end; a long run of blank space or lines is shown as one marker
(`⋯ 2,500 spaces ⋯`). A call whose whole text is not reachable from where it is shown (the upload failed; App
Home, which holds no file) offers no Approve there: Reject stays. Invisible and reordering characters are shown
as `\\u` escapes, with a line saying they were there (mm_core.display.visible), and letters that look like ASCII
ones and are not are named on a line of their own (mm_core.display.lookalikes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatops.buttons import Action, ButtonValue, element
from chatops.schema import ApprovalState
from chatops.secrets import scrub
from chatops.store import ApprovalRow, covered_by_approve_all
from mm_core import display
from slackio.blocks import code_sections, context_block
from slackio.mrkdwn import Mrkdwn, mrkdwn_of

WAITING = "⏸ The turn waits for a decision"
JOB_PROMPT = Mrkdwn("the job's prompt")  # who asked for a job's prompt: nobody wrote it
NO_APPROVERS = "no approvers configured"  # decided_by of a call that nobody in its channel may approve
NOBODY_MAY_APPROVE = (
    "🚫 Not run: nobody may approve calls in this channel. Whoever runs the bot lists approvers (user or user "
    "group ids) under `channels.{channel}.approvers` in its config file, or sets `yolo: true` for the channel."
)
# The label of the file holding a call's whole text, and what the message says of the part only the file has;
# both carry the fingerprint of what is shown (`fingerprint`), so that a message names its file and no other.
FILE_TITLE = "Full {what} of the call waiting for approval [{fingerprint}]: {line}"
FILE_NAME = "full-{what}-{fingerprint}.txt"
OMITTED = "⋯ {between} are only in the file “Full {what} of the call waiting for approval [{fingerprint}]” ⋯"
# Said under a head and a tail whose long runs of blank space are shown as one marker.
COLLAPSED = (
    "⋯ marks a long run of blank space or of blank lines, shown short here: the file “Full {what} of the call "
    "waiting for approval [{fingerprint}]” has it as it is."
)
# The digest's first characters: enough to tell two messages' files apart at a glance (the digest itself is what
# binds the approval).
FINGERPRINT_CHARS = 12
# Where the whole text is not reachable, Approve is not offered.
UNSHARED = (
    "⚠ The full {what} could not be uploaded to this thread, so the call cannot be approved: reject it, or ask "
    "for it again."
)
ONLY_IN_THREAD = "The full {what} is only in the thread: open it there to approve this call."
# A call's text is inline when it fits one code section (about 2,900 characters) in at most INLINE_LINES lines,
# without a long run of blank space (display.padded): else an approver reads its head and its tail, the tail next
# to the buttons (where a `| sh` would hide at the end of a long heredoc, or below 250 empty lines), and the rest
# in the file; a wall of text to scroll through (or one Slack folds behind "Show more") is where things are missed.
INLINE_SECTIONS = 1
INLINE_LINES = 40
# The head and the tail: at most this many characters and lines each (cut to whole lines), one code section each.
PART_CHARS = 1000
PART_LINES = 15


@dataclass(frozen=True)
class ApprovalAsked:
    """The worker's event for the renderer: the gated calls of a suspended turn, recorded as approval rows."""

    rows: tuple[ApprovalRow, ...]
    channel: str


@dataclass(frozen=True)
class Layout:
    """How a call is shown in its message: its line and its whole text, inline or as a head and a tail."""

    line: str  # the icon and the head of the title, scrubbed, shown as written (line_block)
    invisible: bool  # the title or the text held invisible or reordering characters (shown escaped)
    code: list[dict[str, Any]]  # the whole text's code sections; when it does not fit, its head's
    omitted: str | None  # mrkdwn: what lies between the head and the tail (None: the text is inline, whole)
    tail: list[dict[str, Any]]  # the tail's code sections
    text: str  # the whole text, escaped: what the uploaded file holds
    what: str  # "command", "diff", "text": what the whole text is
    lookalikes: tuple[str, ...] = ()  # look-alike letters in the title or the text (display.lookalikes)
    collapsed: bool = False  # the head or the tail shows a long run of blank space as one marker
    fingerprint: str = ""  # of what is shown (the row's digest): in the omitted line and the file's title

    @property
    def whole(self) -> bool:
        """The message itself shows all of the text as it is (no file is needed)."""
        return self.omitted is None and not self.collapsed


def when(moment: datetime) -> Mrkdwn:
    """A time every reader sees in their own time zone (Slack's date formatting), with a UTC fallback."""
    fallback = moment.strftime("%Y-%m-%d %H:%M UTC")
    return Mrkdwn(f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>")


def line_of(row: ApprovalRow) -> str:
    """The call's line as people are shown it (not yet mrkdwn): the head of its title, escaped."""
    return _prompt(row).line.text


def fingerprint(row: ApprovalRow) -> str:
    """The short fingerprint of what the row shows: the first characters of its digest (none for a row without)."""
    return (row.shown or "")[:FINGERPRINT_CHARS]


def layout(row: ApprovalRow, secrets: Sequence[str] = ()) -> Layout:
    """The one decision of how a call's text is shown (see the module's docstring)."""

    def mrkdwn(text: str) -> Mrkdwn:
        return mrkdwn_of(text, secrets)

    prompt = _prompt(row)
    what, mark = display.WHAT.get(row.tool, "text"), fingerprint(row)
    text = "\n".join(prompt.details)
    line = scrub(prompt.line.text, list(secrets))
    shown = (line, prompt.invisible)
    padded = display.padded(text)
    if _short(prompt.details) and not padded:
        code = code_sections(prompt.details, mrkdwn)[0]
        return Layout(*shown, code, None, [], text, what, prompt.lookalikes, fingerprint=mark)
    # Cut (and collapsed) after the secrets are masked: a cut through a secret would show the part of it before
    # the cut.
    masked = scrub(text, list(secrets))
    if padded and _short(display.collapsed(text).split("\n")):
        # Short once its blank runs are one marker each: all of it is shown so, and the file has it as it is.
        code = code_sections(display.collapsed(masked).split("\n"), mrkdwn)[0]
        return Layout(*shown, code, None, [], text, what, prompt.lookalikes, True, mark)
    head, tail, head_code, tail_code = _head_and_tail(masked, mrkdwn)
    omitted = OMITTED.format(between=_between(masked, head, tail), what=what, fingerprint=mark)
    collapsed = display.padded(head) or display.padded(tail)
    return Layout(*shown, head_code, omitted, tail_code, text, what, prompt.lookalikes, collapsed, mark)


def _short(lines: Sequence[str]) -> bool:
    """The lines fit one code section, in at most INLINE_LINES lines. Decided on the text as it is, not as masked
    (masking only shortens it): the worker, the bot and App Home, each with its own secrets, must agree on whether a
    call needs its file to be approved."""
    fits, cut = code_sections(lines, lambda piece: mrkdwn_of(piece, ()))
    return not cut and len(fits) <= INLINE_SECTIONS and len(lines) <= INLINE_LINES


def approvable(row: ApprovalRow, *, in_home: bool = False) -> bool:
    """A person deciding there can read the call's whole text: in its message, or in the thread, in the file
    uploaded there (App Home holds no file). Approve is offered, and taken, only then."""
    return _reachable(layout(row), row, in_home)


def _reachable(shown: Layout, row: ApprovalRow, in_home: bool) -> bool:
    return shown.whole or (not in_home and row.text_file is not None)


def file_title(row: ApprovalRow) -> str:
    return FILE_TITLE.format(what=display.WHAT.get(row.tool, "text"), fingerprint=fingerprint(row), line=line_of(row))


def file_name(row: ApprovalRow) -> str:
    return FILE_NAME.format(what=display.WHAT.get(row.tool, "text"), fingerprint=fingerprint(row))


def line_block(line: str) -> dict[str, Any]:
    """🔐 and the call's line, shown as written: rich text, the line as inline code (no mrkdwn reads it, so the
    model's `*`, `_`, `~`, `>` and backticks are characters, not formatting)."""
    elements = [
        {"type": "text", "text": f"{display.PROMPT_ICON} "},
        {"type": "text", "text": line, "style": {"code": True}},
    ]
    return {"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": elements}]}


def approval_blocks(
    row: ApprovalRow, channel: str, secrets: Sequence[str] = (), *, in_home: bool = False, job_run: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """The message's blocks for the row as it stands (in App Home when `in_home`; of a job's run when `job_run`,
    where an "Approve all" covers the run's prompt), and its notification text."""
    shown = layout(row, secrets)
    blocks = [line_block(shown.line)]
    if shown.invisible:
        blocks.append(context_block(display.INVISIBLE_NOTE))
    if shown.lookalikes:
        blocks.append(context_block(display.lookalike_note(shown.lookalikes)))
    blocks += shown.code
    if shown.omitted is not None:
        blocks += [context_block(shown.omitted), *shown.tail]
    if shown.collapsed:
        blocks.append(context_block(COLLAPSED.format(what=shown.what, fingerprint=shown.fingerprint)))
    blocks.append(context_block(_state_line(row, channel, job_run)))
    if row.state == ApprovalState.PENDING:
        reachable = _reachable(shown, row, in_home)
        if not reachable:
            note = ONLY_IN_THREAD if in_home and row.text_file is not None else UNSHARED
            blocks.append(context_block(note.format(what=shown.what)))
        actions = (Action.APPROVE, Action.REJECT, Action.APPROVE_ALL) if reachable else (Action.REJECT,)
        if not covered_by_approve_all(row):  # a rule's call is approved on its own (chatops.store)
            actions = tuple(a for a in actions if a != Action.APPROVE_ALL)
        value = ButtonValue(row.session_id, row.call_id)
        blocks.append(
            {
                "type": "actions",
                "block_id": f"approval:{row.call_id}"[:255],
                "elements": [element(a, value) for a in actions],
            }
        )
    fallback = Mrkdwn("{icon} {line}: {state}").format(
        icon=display.PROMPT_ICON, line=shown.line, state=_fallback_state(row)
    )
    return blocks, fallback[:3000]


def requesters(requested_by: str | None) -> Mrkdwn:
    """Who asked for a call, as mentions (the comma-separated authors of a turn's messages); a job's prompt,
    which nobody wrote, when nobody."""
    people = [p for p in (requested_by or "").split(",") if p]
    return Mrkdwn(", ").join(mention(p) for p in people) if people else JOB_PROMPT


def mention(user: str) -> Mrkdwn:
    """A person's mention (`<@U…>`): Slack's user ids are letters and digits, anything else stays text."""
    return Mrkdwn("<@{user}>").format(user=user)


def _prompt(row: ApprovalRow) -> display.Prompt:
    return display.prompt_of(row.call_id, row.title or row.tool, row.preview or "")


def _head_and_tail(
    text: str, mrkdwn: Callable[[str], Mrkdwn]
) -> tuple[str, str, list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and the last characters of `text` (PART_CHARS and PART_LINES at most) that each fit one code
    section with no line cut, and their code sections, long blank runs collapsed. At least one character lies
    between them: `text` was not shown whole."""
    chars = min(PART_CHARS, (len(text) - 1) // 2)
    while True:
        head, tail = display.excerpt(text, chars, PART_LINES)
        head_code, head_cut = code_sections(display.collapsed(head).split("\n"), mrkdwn)
        tail_code, tail_cut = code_sections(display.collapsed(tail).split("\n"), mrkdwn)
        fits = len(head_code) <= 1 and len(tail_code) <= 1
        if (fits and not head_cut and not tail_cut) or chars <= 1:
            return head, tail, head_code, tail_code
        chars = chars * 2 // 3


def _between(text: str, head: str, tail: str) -> str:
    """What lies between the head and the tail: how many characters, and which lines, to find them in the file."""
    start, end = len(head), len(text) - len(tail)
    middle = text[start:end]
    count = f"{len(middle):,} character{'s' if len(middle) != 1 else ''} in between"
    total = text.count("\n") + 1
    if not middle.strip("\n"):
        return f"{count} (line breaks, of {total:,} lines)"
    first = text.count("\n", 0, start + len(middle) - len(middle.lstrip("\n"))) + 1
    last = text.count("\n", 0, end - (len(middle) - len(middle.rstrip("\n"))) - 1) + 1
    lines = f"within line {first:,}" if first == last else f"lines {first:,} to {last:,}"
    return f"{count} ({lines} of {total:,})"


def _state_line(row: ApprovalRow, channel: str, job_run: bool) -> Mrkdwn:
    at = Mrkdwn(" ") + when(row.decided_at) if row.decided_at else Mrkdwn()
    if row.state == ApprovalState.PENDING:
        asked = Mrkdwn(" · asked by ") + requesters(row.requested_by) if row.requested_by else Mrkdwn()
        expires = Mrkdwn(" · expires ") + when(row.expires_at) if row.expires_at else Mrkdwn()
        return Mrkdwn(WAITING) + asked + expires + _rule_line(row)
    if row.state == ApprovalState.APPROVED and len(row.approved_by) > 1:
        by = Mrkdwn(" and ").join(mention(p) for p in row.approved_by)
        return Mrkdwn("✅ Approved by {by}{at}").format(by=by, at=at) + _rule_line(row)
    if row.decided_by == NO_APPROVERS:
        return Mrkdwn.of(NOBODY_MAY_APPROVE.format(channel=channel))
    by = mention(row.decided_by or "")
    if row.state == ApprovalState.APPROVED:
        who = requesters(None if job_run else row.requested_by)
        also = Mrkdwn(", and every further call {who} asks for in this thread").format(who=who)
        return Mrkdwn("✅ Approved by {by}{also}{at}").format(by=by, also=also if row.approve_all else Mrkdwn(), at=at)
    if row.state == ApprovalState.REJECTED:
        return Mrkdwn("❌ Rejected by {by}{at}").format(by=by, at=at)
    return Mrkdwn("⌛ Not decided: it expired, or the turn was stopped{at}").format(at=at)


def _rule_line(row: ApprovalRow) -> Mrkdwn:
    """Which approval policy rule asked for the call and what of it matched; how many people it needs, who
    approved so far, whom it accepts and when it was escalated. Nothing for a call the tool's own gating asked
    for and nobody escalated."""
    parts: list[Mrkdwn] = []
    if row.rule is not None:
        rule = Mrkdwn("Rule “{rule}”").format(rule=row.rule)
        if row.matched:
            rule += Mrkdwn(" (matched `{matched}`)").format(matched=display.visible(row.matched)[0][:200])
        parts.append(rule)
    if row.needed > 1:
        parts.append(Mrkdwn("needs {n} different approvers, not who asked").format(n=row.needed))
        if row.approved_by and row.state == ApprovalState.PENDING:
            so_far = Mrkdwn(", ").join(mention(p) for p in row.approved_by)
            parts.append(Mrkdwn("{k} of {n} so far: {who}").format(k=len(row.approved_by), n=row.needed, who=so_far))
    if row.approvers is not None and row.state == ApprovalState.PENDING:
        parts.append(Mrkdwn("may decide: ") + _ids(row.approvers))
    if row.escalated_at is not None and row.state == ApprovalState.PENDING:
        parts.append(Mrkdwn("escalated ") + when(row.escalated_at))
    return Mrkdwn("\n📜 ") + Mrkdwn(" · ").join(parts) if parts else Mrkdwn()


def _ids(ids: Sequence[str]) -> Mrkdwn:
    # A user group is named by its id in a message that stays: `<!subteam^…>` would notify it at every edit.
    return Mrkdwn(", ").join(Mrkdwn("`{id}`").format(id=i) if i.startswith("S") else mention(i) for i in ids)


def _fallback_state(row: ApprovalRow) -> str:
    return "waiting for a decision" if row.state == ApprovalState.PENDING else str(row.state)
