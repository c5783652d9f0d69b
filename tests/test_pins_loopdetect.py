"""Pins for the loop detector (mutation pass, issue 8): a repeat is the whole (tool, input, output) triple, the
warning comes at the third repeat and the stop at the sixth, and the detector's own warning is not part of it."""

from __future__ import annotations

from mm_core.loopdetect import LOOP_DETECTED, STOP_AT, WARN_AT, LoopDetector, stop_text, strip_warning
from mm_core.state import SessionState

CALL = ("edit_file", '{"path": "a.py"}', "a.py: edit #1: old text not found")


def test_the_thresholds_are_the_references_three_then_six() -> None:
    # The model is warned after 3 identical calls and stopped after 6 (tools.md, "Loop detection").
    assert (WARN_AT, STOP_AT) == (3, 6)


def test_a_different_output_starts_the_count_again() -> None:
    """The same call whose result changes is progress (polling a build): no warning, no stop."""
    detector = LoopDetector()
    tool, arguments, output = CALL
    assert [detector.record(tool, arguments, output) for _ in range(2)] == [1, 2]
    assert detector.record(tool, arguments, output + " (again)") == 1


def test_a_different_input_starts_the_count_again() -> None:
    """The model trying another input with the same result is not looping: it is not warned."""
    detector = LoopDetector()
    tool, arguments, output = CALL
    assert [detector.record(tool, arguments, output) for _ in range(2)] == [1, 2]
    assert detector.record(tool, '{"path": "b.py"}', output) == 1


def test_a_different_tool_starts_the_count_again() -> None:
    """Two tools that happen to take the same input and say the same thing are not one repeated call."""
    detector = LoopDetector()
    _, arguments, output = CALL
    assert detector.record("read_file", arguments, output) == 1
    assert detector.record("write_file", arguments, output) == 1


def test_the_appended_warning_does_not_break_the_run() -> None:
    """A result replayed from the log carries the warning: it still counts as the same result, so the
    sixth repeat stops the turn after a restart as it would have without one."""
    detector = LoopDetector()
    tool, arguments, output = CALL
    runs = [detector.record(tool, arguments, LoopDetector.annotate(output, n)) for n in range(1, 6)]
    assert runs == [1, 2, 3, 4, 5]


def test_strip_warning_gives_back_the_exact_output() -> None:
    """The tool's own text, to the last character, when the warning comes off."""
    assert strip_warning("done.\n" + LOOP_DETECTED) == "done."
    assert strip_warning("done.") == "done."
    assert strip_warning(LOOP_DETECTED) == LOOP_DETECTED  # not the detector's suffix: no newline before it


def test_the_warning_starts_exactly_at_the_third_repeat() -> None:
    """The model sees the LOOP_DETECTED line on the third identical result, not the second."""
    assert LoopDetector.annotate("x", WARN_AT - 1) == "x"
    assert LoopDetector.annotate("x", WARN_AT) == "x\n" + LOOP_DETECTED
    assert LoopDetector.annotate("x", 0) == "x"  # a failed call is never annotated


def test_reset_forgets_the_run() -> None:
    """After /new the same call is a first call again."""
    detector = LoopDetector()
    for _ in range(4):
        detector.record(*CALL)
    detector.reset()
    assert (detector.last, detector.run) == (None, 0)
    assert detector.record(*CALL) == 1


def test_the_stop_text_names_the_tool_and_the_count() -> None:
    """The error the turn ends with, as tools.md words it."""
    assert stop_text("edit_file") == (
        "[error: the model repeated the same edit_file call 6 times in a row with the same failing result — turn "
        "stopped by the loop detector; rephrase the request, or fix what the tool kept reporting]"
    )


def test_a_fresh_detector_has_seen_nothing() -> None:
    """A new session, or a log with no finished call, replays to a detector with no run at all."""
    assert SessionState.of([]).loop_detector() == LoopDetector(last=None, run=0)
