"""Pins for the session state derived from the log (mutation pass, issue 8): what the turn in progress is,
which calls are pending, interrupted or open to a decision, how a crashed turn is recognised on resume, the
recap's counters and tokens, the loop detector's replay, and the messages the model is sent."""

from __future__ import annotations

from mm_core.events import Counters, Usage
from mm_core.log import (
    AssistantMessage,
    CallStatus,
    Compaction,
    Decision,
    Entry,
    ErrorRecord,
    Nested,
    Outcome,
    Reset,
    ToolCallRequest,
    ToolResult,
    ToolStarted,
    ToolSuspended,
    TurnEnded,
    UserMessage,
    YoloSet,
    to_dict,
)
from mm_core.loopdetect import LoopDetector
from mm_core.state import SUMMARY_PREFIX, SessionState, asking


def ask(*calls: tuple[str, str], text: str = "", tokens: tuple[int, int] = (0, 0)) -> AssistantMessage:
    """A model answer calling `calls`, each (id, tool name), with `{}` as arguments."""
    requests = tuple(ToolCallRequest(call_id, name, "{}") for call_id, name in calls)
    return AssistantMessage(text, tool_calls=requests, prompt_tokens=tokens[0], completion_tokens=tokens[1])


def done(call_id: str, tool: str = "bash", output: str = "ok", status: CallStatus = CallStatus.OK) -> ToolResult:
    return ToolResult(call_id, tool, output, status=status)


EARLIER_TURN: list[Entry] = [
    UserMessage("first"),
    ask(("e1", "bash"), tokens=(100, 10)),
    ToolStarted("e1", "bash"),
    done("e1"),
    ErrorRecord("the earlier turn's error"),
    TurnEnded(Outcome.FAILED),
]


def test_the_conversation_starts_after_the_last_reset() -> None:
    """After /new (twice) the model sees only what came after the last one."""
    log: list[Entry] = [UserMessage("a"), Reset(), UserMessage("b"), Reset(), UserMessage("c")]
    assert SessionState.of(log).entries == [UserMessage("c")]
    assert SessionState.of([UserMessage("a")]).entries == [UserMessage("a")]  # no reset: all of it


def test_the_turn_in_progress_opens_with_the_first_user_message_after_the_last_end() -> None:
    """A message sent while no turn is open starts one; the ended turns before it are not part of it."""
    state = SessionState([*EARLIER_TURN, UserMessage("second"), UserMessage("and more")])
    assert state.turn_start() == len(EARLIER_TURN)
    assert state.turn_entries() == [UserMessage("second"), UserMessage("and more")]
    assert SessionState(EARLIER_TURN).turn_start() is None  # ended: no turn is open
    assert SessionState(EARLIER_TURN).turn_entries() == []
    assert SessionState([UserMessage("only")]).turn_start() == 0


def test_a_started_call_without_a_result_is_interrupted_and_a_suspended_one_is_not() -> None:
    """On resume a call cut off by a crash is reported interrupted; one waiting for approval is not."""
    state = SessionState(
        [
            UserMessage("go"),
            ask(("a", "bash"), ("b", "ask_agent"), ("c", "bash")),
            ToolStarted("a", "bash"),
            ToolStarted("b", "ask_agent"),
            ToolSuspended("b", "ask_agent"),
            ToolStarted("c", "bash"),
            done("c"),
        ]
    )
    assert state.started() == {"a"}


def test_pending_calls_are_the_latest_answers_calls_without_a_result() -> None:
    """The calls still to run (or to decide) are those of the model's latest answer, in its order."""
    state = SessionState([UserMessage("go"), ask(("a", "bash"), ("b", "bash"), ("c", "bash")), done("b")])
    assert [c.id for c in state.pending()] == ["a", "c"]
    assert SessionState([UserMessage("go")]).pending() == []  # no answer yet
    assert SessionState(EARLIER_TURN).pending() == []  # the turn ended: nothing is pending


def test_open_calls_include_the_asked_agents_calls_at_any_depth() -> None:
    """An approval click for a call of an agent asked inside an open ask_agent call counts; one for a call
    inside a finished ask_agent call is stale."""
    inner = [UserMessage("review"), ask(("r1", "bash"))]
    deeper = [UserMessage("look"), ask(("d1", "edit_file"))]
    nested_in_r = [Nested("r1", to_dict(e)) for e in deeper]
    state = SessionState(
        [
            UserMessage("go"),
            ask(("ask", "ask_agent"), ("old", "ask_agent")),
            *[Nested("ask", to_dict(e)) for e in inner],
            *[Nested("ask", to_dict(e)) for e in nested_in_r],
            *[Nested("old", to_dict(e)) for e in [UserMessage("x"), ask(("stale", "bash"))]],
            done("old", "ask_agent"),
        ]
    )
    assert state.open_calls() == {"ask", "r1", "d1"}


def test_the_turns_failure_is_its_last_error() -> None:
    """A turn that crashed after recording errors is ended on resume with the last one, not the first, and
    an earlier turn's error does not end the next turn."""
    state = SessionState([*EARLIER_TURN, UserMessage("go"), ErrorRecord("first"), ErrorRecord("last")])
    assert state.failure() == "last"
    assert SessionState([*EARLIER_TURN, UserMessage("go")]).failure() is None


def test_a_cancelled_result_in_the_turn_means_it_was_being_cancelled() -> None:
    """Only a cancelled result of this turn makes resume finish a cancellation; a rejected one does not."""
    turn: list[Entry] = [UserMessage("go"), ask(("a", "bash"), ("b", "bash"))]
    assert SessionState([*turn, done("a", status=CallStatus.CANCELLED)]).cancelled()
    assert not SessionState([*turn, done("a", status=CallStatus.REJECTED)]).cancelled()
    stopped = done("z", status=CallStatus.CANCELLED)
    earlier = [UserMessage("x"), ask(("z", "bash")), stopped, TurnEnded(Outcome.CANCELLED)]
    assert not SessionState([*earlier, *turn]).cancelled()


def test_the_turn_is_answered_when_the_last_entry_is_an_answer_without_calls() -> None:
    """Resume ends a turn whose final answer is in the log but whose end mark is not, and only that one."""
    answer = ask(text="All done.")
    assert SessionState([UserMessage("go"), answer]).answered()
    assert not SessionState([UserMessage("go"), ask(("a", "bash"))]).answered()  # calls to run
    assert not SessionState([UserMessage("go"), answer, UserMessage("more")]).answered()  # not the last entry
    assert not SessionState([UserMessage("go")]).answered()


def test_approve_all_needs_an_approval_for_all() -> None:
    """Only "approve all" grants the turn's requesters: not a single approval, not "reject all"."""
    turn: list[Entry] = [UserMessage("go", "U1"), ask(("a", "bash"))]
    assert SessionState([*turn, Decision("a", approved=True, all=True)]).granted()
    assert not SessionState([*turn, Decision("a", approved=True)]).granted()
    assert not SessionState([*turn, Decision("a", approved=False, all=True)]).granted()
    assert not SessionState([Decision("a", approved=True, all=True)]).grants()  # no turn: nobody asked


def test_approve_all_covers_its_requesters_turns_and_no_one_else_s() -> None:
    """Issue 21: "Approve all" is a grant to whoever asked for the turn it was given in. Their later turns run
    without asking; a turn someone else asked for (alone, or with them) asks again; `yolo off` and `new` end it."""
    approved: list[Entry] = [
        UserMessage("go", "U0ADA"),
        ask(("a", "bash")),
        Decision("a", approved=True, by="U0GRACE", all=True),
        done("a"),
        ask(text="done"),
        TurnEnded(Outcome.ANSWERED),
    ]
    assert SessionState(approved).grants() == {"U0ADA"}
    assert SessionState([*approved, UserMessage("more", "U0ADA")]).granted()
    assert not SessionState([*approved, UserMessage("mine", "U0LINUS")]).granted()
    assert not SessionState([*approved, UserMessage("both", "U0ADA,U0LINUS")]).granted()
    assert SessionState([*approved, UserMessage("both", "U0ADA,U0LINUS")]).requesters() == {"U0ADA", "U0LINUS"}
    # `yolo off` takes every grant back; `yolo on` is the switch for everyone, not a grant.
    off = SessionState([*approved, YoloSet(False, "U0GRACE"), UserMessage("more", "U0ADA")])
    assert not off.granted() and off.yolo() is False
    on = SessionState([*approved, YoloSet(True, "U0GRACE"), UserMessage("mine", "U0LINUS")])
    assert not on.granted() and on.yolo() is True
    assert on.grants() == {"U0ADA"}  # kept while yolo is on: only `yolo off` takes them back
    assert not SessionState.of([*approved, Reset(), UserMessage("more", "U0ADA")]).granted()
    # A turn nobody wrote (the terminal's person, a job's prompt) is granted as that nobody.
    alone = [UserMessage("go"), ask(("a", "bash")), Decision("a", True, all=True), TurnEnded(Outcome.ANSWERED)]
    assert SessionState([*alone, UserMessage("more")]).granted()
    assert not SessionState([*alone, UserMessage("reply", "U0LINUS")]).granted()


def test_a_standing_grant_covers_its_requesters_alone_until_yolo_is_said() -> None:
    """Issue 21: a job's yolo is a standing grant to its prompt, which nobody wrote ({None}): a turn a person asked
    for (an `ask`, a reply) asks; a turn of the prompt does not; `yolo off` takes it back, `yolo on` is everyone."""
    job = frozenset({None})
    prompt = SessionState([UserMessage("the job's prompt")])
    person = SessionState([UserMessage("Ask the agent reviewer: do it", "U0EVE")])
    assert not asking(prompt, False, job).asks(prompt.requesters())
    assert asking(person, False, job).asks(person.requesters())
    assert asking(person, False).asks(person.requesters()) and not asking(person, True).asks(person.requesters())
    off = SessionState([YoloSet(False, "U0GRACE"), UserMessage("the job's prompt")])
    assert asking(off, True, job).asks(off.requesters())
    on = SessionState([YoloSet(True, "U0GRACE"), UserMessage("mine", "U0EVE")])
    assert not asking(on, False).asks(on.requesters())
    # What `status` reads: everyone, or whom.
    assert asking(person, False, job).granted == job and not asking(person, False, job).everyone


def test_decisions_are_keyed_by_call() -> None:
    """Each call's decision is found by its id (the turn runs the approved ones)."""
    yes, no = Decision("a", approved=True, by="U1"), Decision("b", approved=False, by="U2")
    assert SessionState([UserMessage("go"), yes, no]).decisions() == {"a": yes, "b": no}


def test_the_recap_counts_this_turns_results_by_counter() -> None:
    """The recap after a turn counts its own calls per kind; an earlier turn's and an uncounted tool's are
    not in it."""
    counter_of: dict[str, str | None] = {"bash": "commands", "edit_file": "file_ops", "lsp": "lsp", "fetch": None}
    state = SessionState(
        [
            *EARLIER_TURN,
            UserMessage("go"),
            ask(("a", "bash"), ("b", "edit_file"), ("c", "edit_file"), ("d", "fetch"), ("e", "lsp")),
            done("a"),
            done("b", "edit_file"),
            done("c", "edit_file", status=CallStatus.ERROR),
            done("d", "fetch"),
            done("e", "lsp"),
        ]
    )
    assert state.counters(counter_of) == Counters(commands=1, file_ops=2, skills=0, lsp=1)
    assert SessionState([UserMessage("go")]).counters(counter_of) == Counters()


def test_the_recap_sums_this_turns_tokens() -> None:
    """The tokens shown after a turn are the sum over its model calls, not the earlier turn's."""
    state = SessionState(
        [*EARLIER_TURN, UserMessage("go"), ask(("a", "bash"), tokens=(300, 20)), done("a"), ask(tokens=(400, 5))]
    )
    assert state.usage() == Usage(700, 25)
    assert state.steps() == 2


def test_the_loop_detector_replays_successful_calls_with_their_arguments() -> None:
    """After a restart the run goes on where it was: ok results count, with the call's own arguments; a
    rejected call does not count (and does not break the run)."""
    entries: list[Entry] = [UserMessage("go")]
    for n in range(3):
        entries += [AssistantMessage("", (ToolCallRequest(f"c{n}", "bash", '{"command": "make"}'),)), done(f"c{n}")]
    entries += [ask(("r", "bash")), done("r", output="[command rejected by the user]", status=CallStatus.REJECTED)]
    detector = SessionState(entries).loop_detector()
    assert (detector.last, detector.run) == (("bash", '{"command": "make"}', "ok"), 3)


def test_the_loop_detector_survives_a_compaction() -> None:
    """tools.md: /compact does not reset the detector (the replay reads the whole log)."""
    entries: list[Entry] = [UserMessage("go")]
    for n in range(2):
        entries += [ask((f"c{n}", "bash")), done(f"c{n}")]
    entries.append(Compaction("summary", keep_from=len(entries)))
    assert SessionState(entries).loop_detector().run == 2


def test_a_result_without_its_call_replays_with_empty_arguments() -> None:
    """A result whose call is not in the log (compacted away from an old log) still counts, with no input."""
    assert SessionState([done("lost")]).loop_detector() == LoopDetector(("bash", "", "ok"), 1)


def test_the_model_is_sent_the_system_prompt_then_the_conversation() -> None:
    """Each result right after its call (whatever came between them), an empty answer text as null content,
    the calls in the OpenAI shape."""
    call = ToolCallRequest("a", "bash", '{"command": "ls"}')
    entries: list[Entry] = [
        UserMessage("list files"),
        AssistantMessage("", (call,)),
        ToolStarted("a", "bash"),
        ErrorRecord("noise between call and result"),
        done("a", output="x.py\n"),
        AssistantMessage("Here they are."),
    ]
    assert SessionState(entries).messages("SYSTEM") == [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "x.py\n"},
        {"role": "assistant", "content": "Here they are."},
    ]


def test_a_compaction_sends_its_summary_then_the_kept_entries_and_what_followed() -> None:
    """After /compact the model gets the summary, the entries kept from `keep_from`, and everything after the
    compaction, without the compacted part or the compaction itself."""
    entries: list[Entry] = [
        UserMessage("old question"),
        AssistantMessage("old answer"),
        UserMessage("kept question"),
        AssistantMessage("kept answer"),
        Compaction("they asked things", keep_from=2),
        UserMessage("new question"),
    ]
    assert SessionState(entries).messages("S") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": SUMMARY_PREFIX + "they asked things"},
        {"role": "user", "content": "kept question"},
        {"role": "assistant", "content": "kept answer"},
        {"role": "user", "content": "new question"},
    ]
    assert SUMMARY_PREFIX == "Summary of the earlier conversation:\n"
