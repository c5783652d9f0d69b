"""`mm-bot run`: the agent core in a terminal, so a config and a model can be tried before wiring Slack.

Interactive line mode with the reference's 🔐 prompt, or one shot with `-p PROMPT` (a call that would ask is
rejected, as in the reference's `mm -p`). It works in the current directory and keeps the session in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from chatops.config import ConfigError, load_config
from mm_core import (
    Agent,
    CallsDropped,
    Decision,
    Error,
    Event,
    MemoryStore,
    ModelError,
    NetworkUsed,
    PermissionRequested,
    Status,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    display,
)
from mm_core.tools import build_tools

DESCRIPTION = "the agent core in a terminal, so a config and a model can be tried before wiring Slack"
DIM, RESET = "\033[2m", "\033[0m"
HELP = "commands: /new (fresh conversation), /compact (summarise older history), /quit; Ctrl-C stops a turn"


class Renderer:
    """Lays out mm_core.display's lines the way the reference's line mode does."""

    def __init__(self, out: TextIO, color: bool, oneshot: bool = False):
        self.out, self.color, self.oneshot, self.mid_line = out, color, oneshot, False

    def dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.color else text

    def __call__(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.write(event.text)
            self.mid_line = not event.text.endswith("\n")
            return
        if isinstance(event, (Status, PermissionRequested)):
            return  # no spinner in a log-like line mode; the prompt is asked by `ask`
        self.newline()
        if isinstance(event, ToolCallStarted):
            line = display.call_line(event)
            self.write(self.line(line) + "\n")
            if line.invisible:
                self.write(self.dim("   " + display.INVISIBLE_NOTE) + "\n")
        elif isinstance(event, ToolCallFinished):
            for line in display.result_lines(event):
                self.write(self.dim("   " + line) + "\n")
            if (denied := display.denied_line(event)) is not None:
                self.write("   " + denied + "\n")
            note = display.oneshot_note(event) if self.oneshot and event.denied_by is None else None
            if note:
                print(f"mm-bot run: {note}", file=sys.stderr, flush=True)
        elif isinstance(event, NetworkUsed):
            if (refused := display.network_line(event)) is not None:
                self.write(f"{event.agent + ' · ' if event.agent else ''}   {refused}\n")
        elif isinstance(event, (Error, CallsDropped)):
            prefix = f"{event.agent} · " if event.agent else ""
            line = display.error_line(event) if isinstance(event, Error) else display.dropped_line(event)
            self.write(prefix + line + "\n")
        elif isinstance(event, TurnFinished):
            recap = display.recap(event)
            if recap:
                self.write(self.dim(recap) + "\n")

    @staticmethod
    def line(line: display.CallLine) -> str:
        # An asked agent's lines carry its name: `reviewer · 🛠️  bash: …` (tools.md, ask_agent's display).
        # The wrench's variation selector makes it one column wide in most terminals: the reference pads it.
        icon = "🛠️ " if line.icon == "🛠️" else line.icon
        return f"{line.agent + ' · ' if line.agent else ''}{icon} {line.title}"

    def newline(self) -> None:
        if self.mid_line:
            self.write("\n")
            self.mid_line = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def ask(event: PermissionRequested, out: TextIO, read: Callable[[str], str] = input) -> list[Decision]:
    decisions = []
    for call in event.calls:
        shown = display.prompt(call)
        out.write(f"{display.PROMPT_ICON} {shown.line.text}\n")
        if shown.invisible:
            out.write(f"   {display.INVISIBLE_NOTE}\n")
        if shown.lookalikes:
            out.write(f"   {display.lookalike_note(shown.lookalikes)}\n")
        if shown.details:
            out.write("\n".join("   " + line for line in shown.details) + "\n")
        try:
            answer = read("   allow? [y]es / [n]o / [a]ll for this session: ").strip().lower()
        except EOFError:  # input ended: nobody is there to allow anything
            answer = "n"
            out.write("\n")
        approve_all = answer in ("a", "all")
        approved = approve_all or answer in ("y", "yes")
        # Bound to what was shown: the call runs only if it would still show exactly that.
        decisions.append(Decision(call.call_id, approved, "terminal", approve_all, call.shown))
        if approve_all:
            break
    return decisions


async def turn(agent: Agent, text: str, pending: list[PermissionRequested], out: TextIO, read) -> None:
    result = await agent.send(text)
    while result.outcome == "suspended":
        result = await agent.resume(ask(pending.pop(), out, read))


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, read=input) -> int:
    parser = argparse.ArgumentParser(prog="mm-bot run", description=DESCRIPTION)
    parser.add_argument("-p", "--prompt", help="one shot: answer this prompt and exit")
    args = parser.parse_args(argv)
    try:
        config = load_config()
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    workspace = Path.cwd()
    tools, warnings = build_tools(config.agent, workspace)
    for warning in warnings:
        print(warning, file=sys.stderr)
    pending: list[PermissionRequested] = []
    render = Renderer(out, color=out.isatty(), oneshot=args.prompt is not None)

    def emit(event: Event) -> None:
        if isinstance(event, PermissionRequested):
            pending.append(event)
        render(event)

    agent = Agent(
        config.agent,
        MemoryStore(),
        str(uuid.uuid4()),
        workspace,
        tools=tools,
        api_key=config.model_api_key,
        emit=emit,
        oneshot=args.prompt is not None,
        # The team's rules hold at the terminal too: a deny refuses, an allow runs; an ask asks the one person there.
        policies=config.service.approvals.policies,
    )
    if args.prompt is not None:
        result = asyncio.run(agent.send(args.prompt))
        render.newline()
        return 0 if result.outcome == "answered" else 1
    return asyncio.run(interactive(agent, pending, render, out, read))


async def interactive(agent: Agent, pending, render: Renderer, out: TextIO, read) -> int:
    out.write(f"mm · {agent.config.model.name} @ {agent.config.model.url} · {HELP}\n")
    loop = asyncio.get_running_loop()
    running: list[asyncio.Task] = []
    # Ctrl-C stops the turn, not the program: the reference's Esc / Ctrl-C.
    loop.add_signal_handler(signal.SIGINT, lambda: [t.cancel() for t in running])
    while True:
        try:
            line = (await loop.run_in_executor(None, read, "> ")).strip()
        except EOFError:
            out.write("\n")
            break
        if not line:
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/new":
            await agent.new()
            out.write("(new conversation)\n")
            continue
        if line == "/compact":
            try:
                out.write(f"({await agent.compact()})\n")
            except ModelError as e:
                out.write(f"(compact failed: {e})\n")
            continue
        running[:] = [asyncio.create_task(turn(agent, line, pending, out, read))]
        try:
            await running[0]
        except asyncio.CancelledError:
            render.newline()
            out.write("(turn stopped)\n")
        running.clear()
        render.newline()
    await agent.resources.aclose()
    return 0
