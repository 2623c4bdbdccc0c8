"""The exception tree. A check's outcome is decided by the exception's class:

- CheckFailed (and plain AssertionError): the code under test is wrong -> FAIL
- KernelFailure: the guest kernel panicked, oopsed or warned -> FAIL
- HarnessError: the test could not complete -> ERROR (MISS before it started)

A harness problem is never reported as FAIL.
"""

from __future__ import annotations


class FarmError(Exception):
    """Base of everything the farm raises."""

    status = "ERROR"


class CheckFailed(FarmError, AssertionError):
    """The code under test did something wrong."""

    status = "FAIL"


class KernelFailure(CheckFailed):
    """The guest kernel reported a panic, oops, BUG or WARN; carries the excerpt."""

    def __init__(self, what: str, excerpt: str, console: str | None = None) -> None:
        self.what = what
        self.excerpt = excerpt
        self.console = console
        where = f" (console: {console})" if console else ""
        super().__init__(f"guest kernel {what}{where}:\n{excerpt}")


class HarnessError(FarmError):
    """The test could not complete: infrastructure, not the code under test."""

    status = "ERROR"


class GuestTimeout(HarnessError):
    """A guest step did not finish in time; the message names the timeout."""


class GuestDied(HarnessError):
    """QEMU exited while the test needed it (and no kernel failure explains it)."""


class EmulatorDied(HarnessError):
    """ax88772-emu exited while the test needed it."""


class AgentError(HarnessError):
    """The guest agent answered something unusable."""


class SetupError(HarnessError):
    """The harness could not start what the test needs; the test did not run."""

    status = "MISS"


class MissingKernel(SetupError):
    """No kernel image where one was expected."""
