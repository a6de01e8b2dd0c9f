"""One exception family; the CLI maps each kind to an exit code in one place."""

from __future__ import annotations


class KdtreeError(Exception):
    """Base of every error kdtree reports to a user: a one-line message, no traceback needed.

    `file` is the path at fault (if any) and `field` the path inside it (`cases[3].budget`).
    """

    def __init__(self, message: str, *, file: object = None, field: str | None = None,
                 line: int | None = None):
        self.message = message
        self.file = None if file is None else str(file)
        self.field = field
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        if self.field:
            where += f"{self.field}: "
        return where + self.message


class BundleError(KdtreeError):
    """A KDTR bundle is malformed or unreadable."""


class SpecError(KdtreeError):
    """A YAML suite is malformed."""


class UsageError(KdtreeError):
    """Bad command-line usage or an option value out of range."""


class ConfigError(KdtreeError):
    """A bad environment variable."""


class LimitError(KdtreeError):
    """A case would exceed a resource bound (memory) or ran out of it."""


class WriteError(KdtreeError, OSError):
    """An output file could not be written (a full disk, a file-size limit, a vanished folder).
    Still an OSError, so callers that tolerate a failed write (the cubin cache) go on doing so."""


class CompileError(KdtreeError):
    """NVRTC refused a kernel; the message carries the log."""


class DeviceError(KdtreeError):
    """No usable GPU or driver, or a CUDA call failed."""


class LaunchError(DeviceError):
    """A kernel launch failed for one case (the case fails; others go on where possible)."""


REASON_CHARS = 200     # a reason is one line of a table or a record row, not a log


def reason(err: BaseException) -> str:
    """The one-line reason an error gives in a row, a record or a message: `Type: first line`
    (a kdtree error's own message is already a sentence for the user: no type in front)."""
    lines = str(err).strip().splitlines()
    text = lines[0][:REASON_CHARS] if lines else ""
    if isinstance(err, KdtreeError):
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
