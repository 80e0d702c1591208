"""Tessera's Python exceptions.

Every error of the native client (an absl::Status with a tessera.v1.ErrorDetail payload) is
raised as a subclass of :class:`TesseraError` chosen by its status code, which says who
retries (DESIGN.md, STYLE.md 3): :class:`InvalidArgumentError` — the request or plan is wrong
(DUPLICATE_FQN, MALFORMED_SHARD, ...), fix the call; :class:`AbortedError` — restart the save;
:class:`FailedPreconditionError` — fix state first (STEP_EXISTS); :class:`UnavailableError` —
retry the call; and so on. Checks done in Python before any RPC (unsupported dtype,
non-contiguous tensor, a bad Shard) raise :class:`InvalidArgumentError` with code
MALFORMED_SHARD too, so one ``except`` covers both.
"""

__all__ = [
    "TesseraError",
    "InvalidArgumentError",
    "AbortedError",
    "FailedPreconditionError",
    "NotFoundError",
    "DataLossError",
    "UnavailableError",
    "DeadlineExceededError",
    "ResourceExhaustedError",
    "InternalError",
]


class TesseraError(Exception):
    """A Tessera error.

    Attributes:
      code: the tessera.v1.ErrorCode name without its prefix ("DUPLICATE_FQN",
        "CHECKPOINT_NOT_FOUND", ...); for an error without one (a dropped connection), the
        status code name ("UNAVAILABLE").
      status_code: the absl status code name ("INVALID_ARGUMENT", "ABORTED", ...).
      message: one sentence a person can act on.
      fqns: tensors involved (may be empty).
      ranks: (rank, "pp=1,dp=0") pairs of the ranks involved (may be empty).
      state_key: the optimizer state key, where it matters ("" otherwise).
      path: the file or directory involved ("" otherwise).
    """

    status_name = "UNKNOWN"

    def __init__(self, message, code=None, status_code=None, fqns=(), ranks=(), state_key="",
                 path=""):
        super().__init__(message)
        self.message = message
        self.status_code = status_code or self.status_name
        self.code = code or self.status_code
        self.fqns = list(fqns)
        self.ranks = [tuple(r) for r in ranks]
        self.state_key = state_key
        self.path = path

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


class InvalidArgumentError(TesseraError, ValueError):
    """The request is wrong (a malformed tensor, a rejected plan); nothing was copied."""
    status_name = "INVALID_ARGUMENT"


class AbortedError(TesseraError):
    """The save was aborted (agent lost, replica diverged, I/O error); save again."""
    status_name = "ABORTED"


class FailedPreconditionError(TesseraError):
    """State must be fixed first (the step exists, a save is in progress, no GPU)."""
    status_name = "FAILED_PRECONDITION"


class NotFoundError(TesseraError, LookupError):
    """No such checkpoint or save."""
    status_name = "NOT_FOUND"


class DataLossError(TesseraError):
    """Stored bytes do not match their checksum."""
    status_name = "DATA_LOSS"


class UnavailableError(TesseraError, ConnectionError):
    """The agent (or its coordinator) is unreachable; retrying the call may succeed."""
    status_name = "UNAVAILABLE"


class DeadlineExceededError(TesseraError, TimeoutError):
    """The call's deadline passed."""
    status_name = "DEADLINE_EXCEEDED"


class ResourceExhaustedError(TesseraError):
    """Staging does not fit (the node's host-RAM budget)."""
    status_name = "RESOURCE_EXHAUSTED"


class InternalError(TesseraError):
    """A bug or an unexpected failure (a failed CUDA copy, a malformed agent reply)."""
    status_name = "INTERNAL"


_BY_STATUS = {cls.status_name: cls for cls in (
    InvalidArgumentError, AbortedError, FailedPreconditionError, NotFoundError, DataLossError,
    UnavailableError, DeadlineExceededError, ResourceExhaustedError, InternalError)}


def from_status(code, status_code, message, detail=None):
    """The TesseraError for the native module's StatusError arguments."""
    detail = detail or {}
    cls = _BY_STATUS.get(status_code, TesseraError)
    return cls(message, code=None if code == "UNSPECIFIED" else code, status_code=status_code,
               fqns=detail.get("fqns", ()), ranks=detail.get("ranks", ()),
               state_key=detail.get("state_key", ""), path=detail.get("path", ""))


def malformed(message, fqn=None, state_key=""):
    """An InvalidArgumentError with code MALFORMED_SHARD, raised before any RPC."""
    return InvalidArgumentError(message, code="MALFORMED_SHARD", fqns=[fqn] if fqn else [],
                                state_key=state_key or "")
