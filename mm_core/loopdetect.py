"""The loop detector, exactly as the reference: the same (tool, input, output) 3 times in a row gets a
warning appended; 3 more and the turn stops.

Its state is a run length, replayed from the log when the session is read (see state.py), so it survives a
suspension or a restart, and then fed each result as it is appended.
"""

from __future__ import annotations

from dataclasses import dataclass

WARN_AT = 3
STOP_AT = 6
LOOP_DETECTED = (
    "[LOOP_DETECTED: You have attempted the same action multiple times with the same result. "
    "Please try a different approach or provide more information.]"
)
_SUFFIX = "\n" + LOOP_DETECTED


def stop_text(tool: str) -> str:
    return (
        f"[error: the model repeated the same {tool} call {STOP_AT} times in a row with the same failing "
        f"result — turn stopped by the loop detector; rephrase the request, or fix what the tool kept "
        f"reporting]"
    )


def strip_warning(output: str) -> str:
    """The output as the tool produced it, without the warning the detector appended."""
    return output[: -len(_SUFFIX)] if output.endswith(_SUFFIX) else output


@dataclass
class LoopDetector:
    last: tuple[str, str, str] | None = None
    run: int = 0

    def record(self, tool: str, arguments: str, output: str) -> int:
        """Record one call and return how many times in a row it has now been seen."""
        key = (tool, arguments, strip_warning(output))
        self.run = self.run + 1 if key == self.last else 1
        self.last = key
        return self.run

    def reset(self) -> None:
        self.last, self.run = None, 0

    @staticmethod
    def annotate(output: str, run: int) -> str:
        return output + _SUFFIX if run >= WARN_AT else output
