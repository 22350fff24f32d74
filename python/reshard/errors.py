"""reshard's exceptions: one class per status code of the library (absl::StatusCode).

Every error the library reports arrives as one of these with the library's one-sentence message
unchanged (it names the tensor, rank and field where there is one). Each class also derives from
the built-in exception a Python caller would expect, so ``except ValueError`` catches a bad spec
and ``except TimeoutError`` a passed deadline.
"""

__all__ = [
    "Error", "CancelledError", "UnknownError", "InvalidArgumentError", "DeadlineExceededError",
    "NotFoundError", "AlreadyExistsError", "PermissionDeniedError", "ResourceExhaustedError",
    "FailedPreconditionError", "AbortedError", "OutOfRangeError", "UnimplementedError",
    "InternalError", "UnavailableError", "DataLossError", "UnauthenticatedError",
]


class Error(RuntimeError):
    """Base class of reshard's errors. ``code`` is the status code's name ("INVALID_ARGUMENT")."""
    code = "UNKNOWN"


class CancelledError(Error):
    code = "CANCELLED"


class UnknownError(Error):
    code = "UNKNOWN"


class InvalidArgumentError(Error, ValueError):
    """A bad spec, layout or buffer (missing, wrong size, wrong dtype)."""
    code = "INVALID_ARGUMENT"


class DeadlineExceededError(Error, TimeoutError):
    """A timeout passed before the refit, set-up or barrier finished."""
    code = "DEADLINE_EXCEEDED"


class NotFoundError(Error, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(Error, PermissionError):
    """A wrong store token."""
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error):
    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """Ranks planned different specs; a refit after a failure without reset(); a refit in flight."""
    code = "FAILED_PRECONDITION"


class AbortedError(Error):
    code = "ABORTED"


class OutOfRangeError(Error, IndexError):
    code = "OUT_OF_RANGE"


class UnimplementedError(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class InternalError(Error):
    code = "INTERNAL"


class UnavailableError(Error, ConnectionError):
    """A peer or the store is gone."""
    code = "UNAVAILABLE"


class DataLossError(Error):
    code = "DATA_LOSS"


class UnauthenticatedError(Error):
    code = "UNAUTHENTICATED"


# Read by the extension (python/src/module.cc): absl::StatusCode value -> class; and by
# RefitHandle, which tells the other ranks the code of a failure found before set-up.
_BY_CODE = {
    1: CancelledError, 2: UnknownError, 3: InvalidArgumentError, 4: DeadlineExceededError,
    5: NotFoundError, 6: AlreadyExistsError, 7: PermissionDeniedError, 8: ResourceExhaustedError,
    9: FailedPreconditionError, 10: AbortedError, 11: OutOfRangeError, 12: UnimplementedError,
    13: InternalError, 14: UnavailableError, 15: DataLossError, 16: UnauthenticatedError,
}
