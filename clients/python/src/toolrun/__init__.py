"""toolrun: the Python client of the toolrun gateway's gRPC API.

>>> from toolrun import Client
>>> with Client("127.0.0.1:50051") as client:
...     result = client.call("calculator", expression="2**10")
...     result.ok, result.output["formatted"]
(True, '1024')

A tool's failure is data: a :class:`ToolResult` with ``ok`` false and ``error.code`` (e.g.
``"TIMEOUT"``). Transport failures raise :class:`ToolrunError` subclasses.
"""

from __future__ import annotations

from .aio import AsyncClient, AsyncSession
from .client import Client, Session
from .custom import custom_tool_config, custom_tool_script
from .errors import (
    AlreadyExists,
    ApprovalNotFound,
    Cancelled,
    ConnectionError,
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SessionNotFound,
    ToolrunError,
    Unauthenticated,
    Unavailable,
)
from .schema import function_to_tool_definition, type_to_schema, validate_tool_name
from .types import (
    Approval,
    ApprovalRequest,
    Call,
    ClosedSession,
    Decision,
    ProviderResults,
    Result,
    SessionInfo,
    Stderr,
    Stdout,
    StreamEvent,
    ToolDefinition,
    ToolError,
    ToolResult,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "Approval",
    "ApprovalNotFound",
    "ApprovalRequest",
    "AsyncClient",
    "AsyncSession",
    "Call",
    "Cancelled",
    "Client",
    "ClosedSession",
    "ConnectionError",
    "DeadlineExceeded",
    "Decision",
    "FailedPrecondition",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ProviderResults",
    "ResourceExhausted",
    "Result",
    "Session",
    "SessionInfo",
    "SessionNotFound",
    "Stderr",
    "Stdout",
    "StreamEvent",
    "ToolDefinition",
    "ToolError",
    "ToolResult",
    "ToolrunError",
    "Unauthenticated",
    "Unavailable",
    "custom_tool_config",
    "custom_tool_script",
    "function_to_tool_definition",
    "type_to_schema",
    "validate_tool_name",
]
