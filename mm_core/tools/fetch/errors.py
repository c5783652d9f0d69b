"""The reference's three failure classes; every failure of the tool is one of them."""

from __future__ import annotations

from mm_core.errors import CoreError

CONVERSION, INPUT, USAGE = 1, 2, 3
_CLASS = {CONVERSION: "conversion", INPUT: "input", USAGE: "usage"}


class FetchError(CoreError):
    """A failure the model is told about as `[fetch_content: error N (<class>) — <reason>]`."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason

    def text(self) -> str:
        return f"[fetch_content: error {self.code} ({_CLASS[self.code]}) — {self.reason}]"


class BlockedAddress(FetchError):
    """The SSRF guard refused an address; raised from inside the connection so no byte is sent."""

    def __init__(self, reason: str):
        super().__init__(INPUT, reason)
