"""The SDK's data: typed, plain dataclasses converted from the generated protobuf messages.

Enum values are lowercase strings without their prefix (``"computation"``, ``"safe"``,
``"write"``), except error codes, which keep the upper-case names the gateway documents
(``"TIMEOUT"``, ``"INVALID_ARGUMENTS"``...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from .v1 import toolrun_pb2 as pb


def _enum_name(enum: Any, value: int, prefix: str, lower: bool = True) -> str:
    """``ERROR_CODE_TIMEOUT`` -> ``TIMEOUT`` (or lowercase); an unknown number as text."""
    try:
        name = str(enum.Name(value))
    except ValueError:
        return str(value)
    if name.startswith(prefix):
        name = name[len(prefix) :]
    return name.lower() if lower else name


def _json_or_none(text: str) -> Any:
    """Parsed JSON text, or None for an empty string."""
    return json.loads(text) if text else None


@dataclass(frozen=True)
class ToolDefinition:
    """One tool as the gateway lists it (``Client.tools()``)."""

    id: str
    name: str
    description: str
    version: str
    category: str
    input_schema: Dict[str, Any]
    output_schema: Optional[Dict[str, Any]]
    sandbox_required: bool
    side_effect: str
    determinism: str
    approval_policy: str
    timeout_ms: int
    required_capabilities: List[str] = field(default_factory=list)
    aliases: List[str] = field(default_factory=list)
    #: The definition in the provider form asked for (``tools(format=...)``), else None.
    rendered: Any = None

    @classmethod
    def from_pb(cls, m: Any) -> "ToolDefinition":
        return cls(
            id=m.id,
            name=m.name,
            description=m.description,
            version=m.version,
            category=_enum_name(pb.Category, m.category, "CATEGORY_"),
            input_schema=_json_or_none(m.input_schema_json) or {},
            output_schema=_json_or_none(m.output_schema_json),
            sandbox_required=m.sandbox_required,
            side_effect=_enum_name(pb.SideEffect, m.side_effect, "SIDE_EFFECT_"),
            determinism=_enum_name(pb.Determinism, m.determinism, "DETERMINISM_"),
            approval_policy=_enum_name(pb.ApprovalPolicy, m.approval_policy, "APPROVAL_POLICY_"),
            timeout_ms=m.timeout_ms,
            required_capabilities=list(m.required_capabilities),
            aliases=list(m.aliases),
            rendered=_json_or_none(m.rendered_json),
        )


@dataclass(frozen=True)
class ToolError:
    """Why a call failed: a typed code a program (or a model) can act on."""

    #: The gateway's error code, e.g. ``"TIMEOUT"``, ``"INVALID_ARGUMENTS"``, ``"UNKNOWN_TOOL"``.
    code: str
    message: str
    #: Structured context (a JSON object), when the gateway gave one.
    details: Optional[Dict[str, Any]] = None

    @classmethod
    def from_pb(cls, m: Any) -> "ToolError":
        return cls(
            code=_enum_name(pb.ErrorCode, m.code, "ERROR_CODE_", lower=False),
            message=m.message,
            details=_json_or_none(m.details_json),
        )


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call. A failure is data: ``ok`` false and ``error`` set."""

    call_id: str
    #: The canonical tool id (aliases resolved).
    tool: str
    ok: bool
    #: The tool's output, parsed from JSON; also present on some failures (e.g. run_code's
    #: stdout and stderr with a non-zero exit). None when there is none.
    output: Any
    error: Optional[ToolError]
    #: Lowercase hex BLAKE3 of :attr:`output_json` (empty when there is no output).
    output_hash: str
    duration_us: int
    #: The output exactly as the gateway sent it (RFC 8785 canonical JSON).
    output_json: str = ""

    @classmethod
    def from_pb(cls, m: Any) -> "ToolResult":
        return cls(
            call_id=m.call_id,
            tool=m.tool,
            ok=m.ok,
            output=_json_or_none(m.output_json),
            error=ToolError.from_pb(m.error) if m.HasField("error") else None,
            output_hash=m.output_hash,
            duration_us=m.duration_us,
            output_json=m.output_json,
        )

    @property
    def code(self) -> Optional[str]:
        """The error code, or None when the call succeeded."""
        return self.error.code if self.error is not None else None


@dataclass(frozen=True)
class Approval:
    """A call waiting for a human's decision (approve or deny)."""

    approval_id: str
    session_id: str
    call_id: str
    tool: str
    #: The call's arguments, parsed.
    arguments: Dict[str, Any]
    #: Human-readable; for write_file and edit it ends with a diff preview.
    reason: str
    #: ``"read"``, ``"write"``, ``"execute"`` or ``"destructive"``.
    kind: str
    requested_at_ms: int
    #: No decision by then: the call ends with APPROVAL_REQUIRED.
    expires_at_ms: int

    @property
    def id(self) -> str:
        """Same as :attr:`approval_id`."""
        return self.approval_id

    @classmethod
    def from_pb(cls, m: Any) -> "Approval":
        return cls(
            approval_id=m.approval_id,
            session_id=m.session_id,
            call_id=m.call_id,
            tool=m.tool,
            arguments=_json_or_none(m.arguments_json) or {},
            reason=m.reason,
            kind=_enum_name(pb.ApprovalKind, m.kind, "APPROVAL_KIND_"),
            requested_at_ms=m.requested_at_ms,
            expires_at_ms=m.expires_at_ms,
        )


@dataclass(frozen=True)
class Decision:
    """The gateway's answer to ``approve``/``deny``."""

    approval: Approval
    approved: bool


@dataclass(frozen=True)
class SessionInfo:
    """A session's state as the gateway reports it."""

    session_id: str
    #: ``"none"`` (every call that can need approval asks), ``"safe"`` or ``"all"``.
    approval_mode: str
    idle_timeout_seconds: int
    created_at_ms: int
    last_used_at_ms: int
    expires_at_ms: int
    workspace_bytes_used: int
    workspace_bytes_limit: int
    workspace_files_used: int
    workspace_files_limit: int
    calls_running: int
    #: Where programs see the workspace (``/workspace``).
    workspace_path: str

    @classmethod
    def from_pb(cls, m: Any) -> "SessionInfo":
        return cls(
            session_id=m.session_id,
            approval_mode=_enum_name(pb.ApprovalMode, m.approval_mode, "APPROVAL_MODE_"),
            idle_timeout_seconds=m.idle_timeout_seconds,
            created_at_ms=m.created_at_ms,
            last_used_at_ms=m.last_used_at_ms,
            expires_at_ms=m.expires_at_ms,
            workspace_bytes_used=m.workspace_bytes_used,
            workspace_bytes_limit=m.workspace_bytes_limit,
            workspace_files_used=m.workspace_files_used,
            workspace_files_limit=m.workspace_files_limit,
            calls_running=m.calls_running,
            workspace_path=m.workspace_path,
        )


@dataclass(frozen=True)
class ClosedSession:
    """What ``close()`` answers: the session as it was, and how many calls were killed."""

    session: SessionInfo
    calls_cancelled: int


@dataclass(frozen=True)
class ProviderResults:
    """The answer to ``call_provider_tools``."""

    #: The provider's tool-result message(s), parsed: ready to append to the conversation
    #: (a list of messages or one message, as the provider expects).
    messages: Any
    #: The same results in toolrun's form, in request order.
    results: List[ToolResult]


@dataclass(frozen=True)
class Call:
    """One call of a batch (``call_many``)."""

    tool: str
    arguments: Dict[str, Any] = field(default_factory=dict)
    session_id: Optional[str] = None
    #: Upper bound for this call in seconds (None: the tool's configured timeout).
    timeout: Optional[float] = None
    #: Echoed in the result; the gateway makes one when None.
    call_id: Optional[str] = None


# ---- stream events ----


@dataclass(frozen=True)
class Stdout:
    """A chunk of the program's standard output, as it was written."""

    data: bytes

    @property
    def text(self) -> str:
        """The chunk decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Stderr:
    """A chunk of the program's standard error."""

    data: bytes

    @property
    def text(self) -> str:
        """The chunk decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ApprovalRequest:
    """The call waits for this approval (sent before anything runs)."""

    approval: Approval


@dataclass(frozen=True)
class Result:
    """The call's final result: the last event of a stream."""

    result: ToolResult


#: What ``stream()`` yields.
StreamEvent = Union[Stdout, Stderr, ApprovalRequest, Result]


def event_from_pb(m: Any) -> Optional[StreamEvent]:
    """The typed event for a ``ToolEvent``; None for an event this SDK does not know."""
    kind = m.WhichOneof("event")
    if kind == "stdout":
        return Stdout(bytes(m.stdout.data))
    if kind == "stderr":
        return Stderr(bytes(m.stderr.data))
    if kind == "approval":
        return ApprovalRequest(Approval.from_pb(m.approval))
    if kind == "result":
        return Result(ToolResult.from_pb(m.result))
    return None
