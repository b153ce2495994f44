"""The asyncio client (grpc.aio): :class:`AsyncClient` and its :class:`AsyncSession`.

The same API as :class:`toolrun.Client`, with coroutines, and async iterators for
``stream`` and ``watch_approvals``.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Awaitable, Iterable, List, Mapping, Optional, Type, Union

import grpc
import grpc.aio

from . import errors
from ._common import (
    CHANNEL_OPTIONS,
    DEFAULT_ADDRESS,
    Pem,
    auth_metadata,
    CallSpec,
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


def _with_metadata(details: Any, metadata: tuple) -> Any:
    extra = list(details.metadata or ()) + list(metadata)
    return grpc.aio.ClientCallDetails(
        details.method,
        details.timeout,
        grpc.aio.Metadata(*extra),
        details.credentials,
        details.wait_for_ready,
    )


class _AsyncUnaryAuth(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the API key's metadata to every unary call."""

    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_metadata(details, self._metadata), request)


class _AsyncStreamAuth(grpc.aio.UnaryStreamClientInterceptor):
    """Adds the API key's metadata to every server-streaming call."""

    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_metadata(details, self._metadata), request)


class AsyncClient:
    """A connection to a toolrun gateway over gRPC, for asyncio.

    Args:
        address: ``host:port`` of the gateway's gRPC listener (``http://`` is accepted too).
        timeout: Deadline in seconds for every RPC (None: no deadline).
        channel: An existing ``grpc.aio.Channel`` to use instead of opening one (then put
            the API key in its interceptors or call credentials yourself).
        api_key: The gateway's API key, sent as ``authorization: Bearer <key>`` with every
            call (default: ``$TOOLRUN_API_KEY``).
        tls_ca, tls_cert, tls_key, tls_server_name: TLS and the client certificate, as
            :class:`~toolrun.Client` takes them.

    The channel opens on first use, in the running event loop. Use as an async context
    manager, or await :meth:`close`.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: Optional[float] = None,
        *,
        channel: Optional[grpc.aio.Channel] = None,
        api_key: Optional[str] = None,
        tls_ca: Optional[Pem] = None,
        tls_cert: Optional[Pem] = None,
        tls_key: Optional[Pem] = None,
        tls_server_name: Optional[str] = None,
    ) -> None:
        self.address = strip_address(address)
        self.timeout = timeout
        self._metadata = auth_metadata(api_key)
        self._tls = (
            None
            if channel is not None
            else tls_channel(address, tls_ca, tls_cert, tls_key, tls_server_name)
        )
        if channel is not None and api_key is not None:
            raise ValueError(
                "api_key goes with an address: with your own channel, add the key to its "
                "interceptors"
            )
        self._channel: Optional[grpc.aio.Channel] = channel
        self._stub_: Optional[pb_grpc.ToolServiceStub] = (
            pb_grpc.ToolServiceStub(channel)  # type: ignore[no-untyped-call]
            if channel is not None
            else None
        )

    @property
    def _stub(self) -> pb_grpc.ToolServiceStub:
        if self._stub_ is None:
            interceptors = (
                [_AsyncUnaryAuth(self._metadata), _AsyncStreamAuth(self._metadata)]
                if self._metadata
                else None
            )
            if self._tls is not None:
                self._channel = grpc.aio.secure_channel(
                    self.address,
                    self._tls[0],
                    options=CHANNEL_OPTIONS + self._tls[1],
                    interceptors=interceptors,
                )
            else:
                self._channel = grpc.aio.insecure_channel(
                    self.address, options=CHANNEL_OPTIONS, interceptors=interceptors
                )
            self._stub_ = pb_grpc.ToolServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub_

    async def close(self) -> None:
        """Closes the channel; RPCs in flight are cancelled."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub_ = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _unary(
        self,
        method: Any,
        request: Any,
        not_found: Type[errors.NotFound] = errors.NotFound,
    ) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, not_found) from None

    # ---- tools ----

    async def tools(self, format: Optional[str] = None) -> List[ToolDefinition]:
        """Every enabled tool's definition (see :meth:`toolrun.Client.tools`)."""
        resp = await self._unary(
            self._stub.ListTools, pb.ListToolsRequest(format=format_value(format))
        )
        return [ToolDefinition.from_pb(t) for t in resp.tools]

    async def call(
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
        """Runs one tool call (see :meth:`toolrun.Client.call`)."""
        req = call_request(
            tool,
            merge_arguments(arguments, args),
            session_id=session_id,
            timeout=timeout,
            call_id=call_id,
        )
        return ToolResult.from_pb((await self._unary(self._stub.CallTool, req)).result)

    async def call_many(
        self, calls: Iterable[CallSpec], *, session_id: Optional[str] = None
    ) -> List[ToolResult]:
        """Runs a batch concurrently; results in request order (see ``Client.call_many``)."""
        resp = await self._unary(self._stub.CallTools, call_many_request(calls, session_id))
        return [ToolResult.from_pb(r) for r in resp.results]

    async def run_code(
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
        """Runs a program in the sandbox (see :meth:`toolrun.Client.run_code`)."""
        return await self.call(
            "run_code",
            run_code_arguments(code, language, args, env, stdin, timeout),
            session_id=session_id,
        )

    async def stream(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        session_id: Optional[str] = None,
        timeout: Optional[float] = None,
        call_id: Optional[str] = None,
        **args: Any,
    ) -> AsyncIterator[StreamEvent]:
        """Runs one call, yielding output chunks as they happen, then the result.

        An async iterator: ``async for event in client.stream(...)``. Leaving the loop
        early cancels the call.
        """
        req = call_request(
            tool,
            merge_arguments(arguments, args),
            session_id=session_id,
            timeout=timeout,
            call_id=call_id,
        )
        responses = self._stub.StreamTool(req, timeout=self.timeout)
        try:
            async for m in responses:
                ev = event_from_pb(m)
                if ev is not None:
                    yield ev
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        finally:
            responses.cancel()

    # ---- sessions ----

    async def create_session(
        self,
        session_id: Optional[str] = None,
        *,
        approval_mode: Optional[str] = None,
        idle_timeout_seconds: Optional[int] = None,
    ) -> "AsyncSession":
        """Creates a session (see :meth:`toolrun.Client.create_session`)."""
        m = await self._unary(
            self._stub.CreateSession,
            pb.CreateSessionRequest(
                session_id=session_id or "",
                approval_mode=mode_value(approval_mode),
                idle_timeout_seconds=idle_timeout_seconds or 0,
            ),
        )
        return AsyncSession(self, SessionInfo.from_pb(m))

    async def session(self, session_id: str) -> "AsyncSession":
        """A handle on an existing session; SessionNotFound if there is none."""
        return AsyncSession(self, await self.get_session(session_id))

    async def get_session(self, session_id: str) -> SessionInfo:
        """The session's state; :class:`~toolrun.errors.SessionNotFound` if there is none."""
        m = await self._unary(
            self._stub.GetSession,
            pb.GetSessionRequest(session_id=session_id),
            errors.SessionNotFound,
        )
        return SessionInfo.from_pb(m)

    async def list_sessions(self) -> List[SessionInfo]:
        """Every open session."""
        resp = await self._unary(self._stub.ListSessions, pb.ListSessionsRequest())
        return [SessionInfo.from_pb(s) for s in resp.sessions]

    async def close_session(self, session_id: str) -> ClosedSession:
        """Kills whatever still runs in the session and deletes its workspace."""
        resp = await self._unary(
            self._stub.CloseSession,
            pb.CloseSessionRequest(session_id=session_id),
            errors.SessionNotFound,
        )
        return ClosedSession(SessionInfo.from_pb(resp.session), resp.calls_cancelled)

    # ---- approvals ----

    async def approvals(self, session_id: Optional[str] = None) -> List[Approval]:
        """The approvals pending now (of one session, or of every session)."""
        resp = await self._unary(
            self._stub.ListApprovals, pb.ListApprovalsRequest(session_id=session_id or "")
        )
        return [Approval.from_pb(a) for a in resp.approvals]

    async def watch_approvals(self, session_id: Optional[str] = None) -> AsyncIterator[Approval]:
        """The pending approvals first, then each new one as it is asked (until closed)."""
        responses = self._stub.WatchApprovals(
            pb.WatchApprovalsRequest(session_id=session_id or "")
        )
        try:
            async for m in responses:
                yield Approval.from_pb(m)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise errors.from_rpc_error(e) from None
        finally:
            responses.cancel()

    async def approve(
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
        resp = await self._unary(self._stub.DecideApproval, req, errors.ApprovalNotFound)
        return Decision(Approval.from_pb(resp.approval), resp.approved)

    async def deny(self, approval_id: str, message: str = "") -> Decision:
        """Denies a pending call: it ends with APPROVAL_DENIED."""
        req = pb.DecideApprovalRequest(approval_id=approval_id, approve=False, message=message)
        resp = await self._unary(self._stub.DecideApproval, req, errors.ApprovalNotFound)
        return Decision(Approval.from_pb(resp.approval), resp.approved)

    # ---- provider formats ----

    async def call_provider_tools(
        self,
        provider: str,
        message: Union[str, bytes, Mapping[str, Any], List[Any]],
        session_id: Optional[str] = None,
    ) -> ProviderResults:
        """Runs a provider message's tool calls (see ``Client.call_provider_tools``)."""
        req = pb.CallProviderToolsRequest(
            provider=provider, message_json=message_json(message), session_id=session_id or ""
        )
        resp = await self._unary(self._stub.CallProviderTools, req)
        return ProviderResults(
            messages=json.loads(resp.results_json) if resp.results_json else None,
            results=[ToolResult.from_pb(r) for r in resp.results],
        )


class AsyncSession(SessionTools[Awaitable[ToolResult]]):
    """A session's workspace for asyncio: every tool method returns an awaitable result.

    ``async with await client.create_session() as s:`` closes it at the end.
    """

    def __init__(self, client: AsyncClient, info: SessionInfo) -> None:
        self.client = client
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
    ) -> Awaitable[ToolResult]:
        """Any tool call in this session (see :meth:`AsyncClient.call`)."""
        return self.client.call(tool, arguments, session_id=self.id, timeout=timeout, **args)

    def stream(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        /,
        *,
        timeout: Optional[float] = None,
        **args: Any,
    ) -> AsyncIterator[StreamEvent]:
        """A streamed call in this session."""
        return self.client.stream(tool, arguments, session_id=self.id, timeout=timeout, **args)

    async def approvals(self) -> List[Approval]:
        """This session's pending approvals."""
        return await self.client.approvals(self.id)

    def watch_approvals(self) -> AsyncIterator[Approval]:
        """This session's approvals as they are asked."""
        return self.client.watch_approvals(self.id)

    async def refresh(self) -> SessionInfo:
        """The session's current state (also stored in :attr:`info`)."""
        self.info = await self.client.get_session(self.id)
        return self.info

    async def close(self) -> ClosedSession:
        """Kills what still runs in the session and deletes its workspace."""
        return await self.client.close_session(self.id)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.close()
        except errors.SessionNotFound:
            pass

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r})"
