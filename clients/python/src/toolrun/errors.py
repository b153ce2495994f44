"""Typed exceptions for transport failures.

A tool's own failure (bad arguments, unknown tool, timeout, non-zero exit...) is never an
exception: it is a :class:`toolrun.ToolResult` with ``ok`` false and an error code. These
exceptions are for what the gRPC transport reports: the gateway cannot be reached, a
deadline passed, a request was refused (too large, unknown session, bad provider message...).
"""

from __future__ import annotations

import builtins
from typing import Optional

import grpc


class ToolrunError(Exception):
    """Base of every exception the SDK raises.

    Attributes:
        status: The gRPC status code the gateway (or the channel) answered, if any.
        details: The status message.
    """

    def __init__(self, details: str, status: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(f"{status.name}: {details}" if status is not None else details)
        self.status = status
        self.details = details


class Unavailable(ToolrunError, builtins.ConnectionError):
    """The gateway cannot be reached (UNAVAILABLE): not running, wrong address, shutting down.

    Also a builtin :class:`ConnectionError`.
    """


#: Alias: ``except toolrun.ConnectionError`` catches a gateway that cannot be reached.
ConnectionError = Unavailable


class DeadlineExceeded(ToolrunError, builtins.TimeoutError):
    """The RPC's deadline (the client's ``timeout``) passed before the gateway answered.

    Also a builtin :class:`TimeoutError`. A tool's own timeout is a result with code TIMEOUT.
    """


class InvalidArgument(ToolrunError):
    """The gateway refused the request itself (INVALID_ARGUMENT), e.g. an unknown provider."""


class ResourceExhausted(ToolrunError):
    """RESOURCE_EXHAUSTED: a message too large, too many sessions or calls, overload.

    Attributes:
        retry_after: Seconds to wait before retrying, when the gateway said (a tenant over
            its calls per minute or runs in flight), else None.
    """

    retry_after: Optional[float] = None


class NotFound(ToolrunError):
    """NOT_FOUND: what the request names does not exist."""


class SessionNotFound(NotFound):
    """NOT_FOUND from a session RPC: no such session (never created, closed or expired)."""


class ApprovalNotFound(NotFound):
    """NOT_FOUND from DecideApproval: no pending approval with that id."""


class AlreadyExists(ToolrunError):
    """ALREADY_EXISTS, e.g. CreateSession with an id already in use."""


class FailedPrecondition(ToolrunError):
    """FAILED_PRECONDITION, e.g. a gateway that serves no sessions."""


class Unauthenticated(ToolrunError):
    """UNAUTHENTICATED: the gateway wants credentials."""


class PermissionDenied(ToolrunError):
    """PERMISSION_DENIED."""


class Cancelled(ToolrunError):
    """CANCELLED: the RPC was cancelled (by this client or the gateway)."""


class InternalError(ToolrunError):
    """INTERNAL or UNKNOWN: the gateway failed."""


_BY_STATUS: dict[grpc.StatusCode, type[ToolrunError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
}


def from_rpc_error(
    err: grpc.RpcError, not_found: type[NotFound] = NotFound
) -> ToolrunError:
    """The typed exception for a gRPC error; ``not_found`` refines NOT_FOUND for the RPC."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    if code == grpc.StatusCode.NOT_FOUND:
        return not_found(details, code)
    cls = _BY_STATUS.get(code, ToolrunError) if code is not None else ToolrunError
    e = cls(details, code)
    if isinstance(e, ResourceExhausted):
        try:
            trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
            for k, v in trailers or ():
                if k == "retry-after-ms":
                    e.retry_after = int(v) / 1000.0
        except (TypeError, ValueError):
            pass
    return e
