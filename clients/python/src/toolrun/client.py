"""The synchronous client: :class:`Client` and its :class:`Session`."""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Type, Union

import grpc

from . import errors
from ._common import (
    CHANNEL_OPTIONS,
    DEFAULT_ADDRESS,
    AuthInterceptor,
    auth_metadata,
    CallSpec,
    Pem,
    SessionTools,
    call_many_request,
    call_request,
    format_value,
    merge_arguments,
    message_json,
    mode_value,
    run_code_arguments,
    strip_address,
    tls_channel,
)
from .types import (
    Approval,
    ClosedSession,
    Decision,
    ProviderResults,
    SessionInfo,
    StreamEvent,
    ToolDefinition,
    ToolResult,
    event_from_pb,
)
from .v1 import toolrun_pb2 as pb
from .v1 import toolrun_pb2_grpc as pb_grpc


class Client:
    """A connection to a toolrun gateway over gRPC.

    Args:
        address: ``host:port`` of the gateway's gRPC listener (``http://`` is accepted too;
            ``https://`` means TLS).
        timeout: Deadline in seconds for every RPC (None: no deadline). A call's deadline
            also bounds the tool's run: the gateway never runs a call past it.
        channel: An existing ``grpc.Channel`` to use instead of opening one (``address``
            is then ignored), e.g. a secure channel.
        api_key: The gateway's API key, sent as ``authorization: Bearer <key>`` with every
            call (default: ``$TOOLRUN_API_KEY``; none: no authentication, as a gateway on
            loopback without keys accepts). A missing or wrong key raises
            :class:`~toolrun.errors.Unauthenticated`.
        tls_ca: CA certificates (a PEM file's path, or PEM bytes) the gateway's certificate
            must chain to: the channel is TLS (as with an ``https://`` address, which
            without it trusts grpcio's default roots). Default: ``$TOOLRUN_TLS_CA``.
        tls_cert, tls_key: A client certificate and its key (path or PEM bytes) for a
            gateway that verifies them (mutual TLS: the certificate's tenant is the
            caller's). Default: ``$TOOLRUN_TLS_CERT``, ``$TOOLRUN_TLS_KEY``.
        tls_server_name: The name the gateway's certificate must carry, when it is not the
            address's host (e.g. through a port-forward). Default: ``$TOOLRUN_TLS_SERVER_NAME``.

    A tool's failure is data (:class:`ToolResult` with ``ok`` false); transport failures
    raise :class:`~toolrun.errors.ToolrunError` subclasses. Use as a context manager, or
    call :meth:`close`.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: Optional[float] = None,
        *,
        channel: Optional[grpc.Channel] = None,
        api_key: Optional[str] = None,
        tls_ca: Optional[Pem] = None,
        tls_cert: Optional[Pem] = None,
        tls_key: Optional[Pem] = None,
        tls_server_name: Optional[str] = None,
    ) -> None:
        self.address = strip_address(address)
        self.timeout = timeout
        tls = None if channel else tls_channel(address, tls_ca, tls_cert, tls_key, tls_server_name)
        if channel is not None:
            self._channel = channel
        elif tls is not None:
            self._channel = grpc.secure_channel(
                self.address, tls[0], options=CHANNEL_OPTIONS + tls[1]
            )
        else:
            self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        metadata = auth_metadata(api_key)
        calls = (
            grpc.intercept_channel(self._channel, AuthInterceptor(metadata))
            if metadata
            else self._channel
        )
        self._stub = pb_grpc.ToolServiceStub(calls)  # type: ignore[no-untyped-call]

    # ---- lifecycle ----

    def close(self) -> None:
        """Closes the channel; RPCs in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _unary(
        self,
        method: Any,
        request: Any,
        not_found: Type[errors.NotFound] = errors.NotFound,
    ) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, not_found) from None

    # ---- tools ----

    def tools(self, format: Optional[str] = None) -> List[ToolDefinition]:
        """Every enabled tool's definition.

        Args:
            format: A provider (``"openai"``, ``"anthropic"``, ``"mcp"``,
                ``"openai-responses"``, ``"ollama"``, ``"gemini"``): each definition's
                :attr:`~ToolDefinition.rendered` then holds that provider's form.
        """
        resp = self._unary(self._stub.ListTools, pb.ListToolsRequest(format=format_value(format)))
        return [ToolDefinition.from_pb(t) for t in resp.tools]

    def call(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        session_id: Optional[str] = None,
        timeout: Optional[float] = None,
        call_id: Optional[str] = None,
        **args: Any,
    ) -> ToolResult:
        """Runs one tool call.

        Args:
            tool: Tool id or alias, e.g. ``"calculator"``.
            arguments: The arguments as a mapping (merged with ``**args``); use it for
                arguments named like this method's keywords (``timeout``, ``session_id``).
            session_id: Run in this session's workspace.
            timeout: Upper bound for the call in seconds (never raises the tool's own).
            call_id: Echoed in the result (the gateway makes one when None).
            **args: The tool's arguments.

        Returns:
            The result; a failed call has ``ok`` false and ``error.code`` set.
        """
        req = call_request(
            tool,
            merge_arguments(arguments, args),
            session_id=session_id,
            timeout=timeout,
            call_id=call_id,
        )
        return ToolResult.from_pb(self._unary(self._stub.CallTool, req).result)

    def call_many(
        self, calls: Iterable[CallSpec], *, session_id: Optional[str] = None
    ) -> List[ToolResult]:
        """Runs a batch of calls concurrently; the results come back in request order.

        Args:
            calls: :class:`~toolrun.Call` objects, ``(tool, arguments)`` tuples or dicts.
            session_id: The session of every call that names none.
        """
        resp = self._unary(self._stub.CallTools, call_many_request(calls, session_id))
        return [ToolResult.from_pb(r) for r in resp.results]

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        args: Optional[List[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        timeout: Optional[int] = None,
        session_id: Optional[str] = None,
    ) -> ToolResult:
        """Runs a program in the sandbox (the ``run_code`` tool).

        Args:
            code: The program.
            language: ``python``, ``javascript``, ``bash`` or a configured language.
            args: The program's arguments.
            env: Environment variables.
            stdin: Text written to its standard input.
            timeout: Wall-clock limit in whole seconds (run_code's own argument).
            session_id: Run in this session's workspace.

        Returns:
            The result: ``output`` has ``stdout``, ``stderr``, ``exit_code``...; a timeout is
            ``ok`` false with code ``"TIMEOUT"``.
        """
        return self.call(
            "run_code",
            run_code_arguments(code, language, args, env, stdin, timeout),
            session_id=session_id,
        )

    def stream(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        session_id: Optional[str] = None,
        timeout: Optional[float] = None,
        call_id: Optional[str] = None,
        **args: Any,
    ) -> Iterator[StreamEvent]:
        """Runs one call, yielding its output as it happens, then its result.

        Yields :class:`~toolrun.Stdout` and :class:`~toolrun.Stderr` chunks, an
        :class:`~toolrun.ApprovalRequest` when the call waits for one, and finally a
        :class:`~toolrun.Result`. The arguments are those of :meth:`call`. Closing the
        iterator early cancels the call.
        """
        req = call_request(
            tool,
            merge_arguments(arguments, args),
            session_id=session_id,
            timeout=timeout,
            call_id=call_id,
        )
        try:
            responses = self._stub.StreamTool(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return self._events(responses)

    @staticmethod
    def _events(responses: Any) -> Iterator[StreamEvent]:
        try:
            for m in responses:
                ev = event_from_pb(m)
                if ev is not None:
                    yield ev
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        finally:
            responses.cancel()

    # ---- sessions ----

    def create_session(
        self,
        session_id: Optional[str] = None,
        *,
        approval_mode: Optional[str] = None,
        idle_timeout_seconds: Optional[int] = None,
    ) -> "Session":
        """Creates a session: a workspace that persists across calls.

        Args:
            session_id: The id to use (None: a generated, unguessable one).
            approval_mode: ``"none"`` (every call that can need approval asks), ``"safe"``
                (read-only tools run, the rest ask as their policy says) or ``"all"``
                (nothing asks); None: the server's default.
            idle_timeout_seconds: Expire after this long without a call (None: default).
        """
        m = self._unary(
            self._stub.CreateSession,
            pb.CreateSessionRequest(
                session_id=session_id or "",
                approval_mode=mode_value(approval_mode),
                idle_timeout_seconds=idle_timeout_seconds or 0,
            ),
        )
        return Session(self, SessionInfo.from_pb(m))

    def session(self, session_id: str) -> "Session":
        """A handle on an existing session; :class:`~toolrun.errors.SessionNotFound` if none."""
        return Session(self, self.get_session(session_id))

    def get_session(self, session_id: str) -> SessionInfo:
        """The session's state; :class:`~toolrun.errors.SessionNotFound` if there is none."""
        m = self._unary(
            self._stub.GetSession,
            pb.GetSessionRequest(session_id=session_id),
            errors.SessionNotFound,
        )
        return SessionInfo.from_pb(m)

    def list_sessions(self) -> List[SessionInfo]:
        """Every open session."""
        resp = self._unary(self._stub.ListSessions, pb.ListSessionsRequest())
        return [SessionInfo.from_pb(s) for s in resp.sessions]

    def close_session(self, session_id: str) -> ClosedSession:
        """Kills whatever still runs in the session and deletes its workspace."""
        resp = self._unary(
            self._stub.CloseSession,
            pb.CloseSessionRequest(session_id=session_id),
            errors.SessionNotFound,
        )
        return ClosedSession(SessionInfo.from_pb(resp.session), resp.calls_cancelled)

    # ---- approvals ----

    def approvals(self, session_id: Optional[str] = None) -> List[Approval]:
        """The approvals pending now (of one session, or of every session)."""
        resp = self._unary(
            self._stub.ListApprovals, pb.ListApprovalsRequest(session_id=session_id or "")
        )
        return [Approval.from_pb(a) for a in resp.approvals]

    def watch_approvals(self, session_id: Optional[str] = None) -> Iterator[Approval]:
        """The pending approvals first, then each new one as it is asked.

        The iterator runs until closed (``break`` out of the loop, or ``.close()`` it),
        which cancels the watch. The client's ``timeout`` does not apply to it.
        """
        try:
            responses = self._stub.WatchApprovals(
                pb.WatchApprovalsRequest(session_id=session_id or "")
            )
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return self._approvals(responses)

    @staticmethod
    def _approvals(responses: Any) -> Iterator[Approval]:
        try:
            for m in responses:
                yield Approval.from_pb(m)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise errors.from_rpc_error(e) from None
        finally:
            responses.cancel()

    def approve(
        self,
        approval_id: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        message: str = "",
    ) -> Decision:
        """Approves a pending call, optionally with modified arguments."""
        req = pb.DecideApprovalRequest(
            approval_id=approval_id,
            approve=True,
            arguments_json=json.dumps(dict(arguments)) if arguments is not None else "",
            message=message,
        )
        resp = self._unary(self._stub.DecideApproval, req, errors.ApprovalNotFound)
        return Decision(Approval.from_pb(resp.approval), resp.approved)

    def deny(self, approval_id: str, message: str = "") -> Decision:
        """Denies a pending call: it ends with APPROVAL_DENIED and ``message`` as reason."""
        req = pb.DecideApprovalRequest(approval_id=approval_id, approve=False, message=message)
        resp = self._unary(self._stub.DecideApproval, req, errors.ApprovalNotFound)
        return Decision(Approval.from_pb(resp.approval), resp.approved)

    # ---- provider formats ----

    def call_provider_tools(
        self,
        provider: str,
        message: Union[str, bytes, Mapping[str, Any], List[Any]],
        session_id: Optional[str] = None,
    ) -> ProviderResults:
        """Runs the tool calls in a model provider's assistant message.

        Args:
            provider: ``openai``, ``openai-responses``, ``anthropic``, ``ollama``,
                ``gemini`` or ``toolrun``.
            message: The assistant message (or the provider's whole API response), as a
                dict or as JSON text.
            session_id: Applied to every call in the message.

        Returns:
            The provider's tool-result message(s), ready to append to the conversation,
            and the same results as :class:`ToolResult`. An unknown provider or an
            unreadable message raises :class:`~toolrun.errors.InvalidArgument`.
        """
        req = pb.CallProviderToolsRequest(
            provider=provider, message_json=message_json(message), session_id=session_id or ""
        )
        resp = self._unary(self._stub.CallProviderTools, req)
        return ProviderResults(
            messages=json.loads(resp.results_json) if resp.results_json else None,
            results=[ToolResult.from_pb(r) for r in resp.results],
        )


class Session(SessionTools[ToolResult]):
    """A session's workspace: file and execution tools that run with its id.

    Closing it (``close()``, or leaving the ``with`` block) kills what still runs there and
    deletes the workspace.
    """

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self.client = client
        #: The state when this handle was made (see :meth:`refresh`).
        self.info = info

    @property
    def id(self) -> str:
        """The session id."""
        return self.info.session_id

    def call(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        timeout: Optional[float] = None,
        **args: Any,
    ) -> ToolResult:
        """Any tool call in this session (see :meth:`Client.call`)."""
        return self.client.call(tool, arguments, session_id=self.id, timeout=timeout, **args)

    def stream(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        timeout: Optional[float] = None,
        **args: Any,
    ) -> Iterator[StreamEvent]:
        """A streamed call in this session (see :meth:`Client.stream`)."""
        return self.client.stream(tool, arguments, session_id=self.id, timeout=timeout, **args)

    def approvals(self) -> List[Approval]:
        """This session's pending approvals."""
        return self.client.approvals(self.id)

    def watch_approvals(self) -> Iterator[Approval]:
        """This session's approvals as they are asked (see :meth:`Client.watch_approvals`)."""
        return self.client.watch_approvals(self.id)

    def refresh(self) -> SessionInfo:
        """The session's current state (also stored in :attr:`info`)."""
        self.info = self.client.get_session(self.id)
        return self.info

    def close(self) -> ClosedSession:
        """Kills what still runs in the session and deletes its workspace."""
        return self.client.close_session(self.id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except errors.SessionNotFound:
            pass

    def __repr__(self) -> str:
        return f"Session({self.id!r})"
