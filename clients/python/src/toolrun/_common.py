"""What Client and AsyncClient share: request building and the tool helpers."""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, Dict, Generic, Iterable, List, Mapping, Optional, TypeVar, Union

import grpc

from .types import Call
from .v1 import toolrun_pb2 as pb

#: The default gateway address (``toolrun serve``'s default ``--listen``).
DEFAULT_ADDRESS = "127.0.0.1:50051"

#: Largest message the channel sends or accepts (the gateway bounds its own).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

#: The environment variable the API key is read from when ``api_key`` is not given.
API_KEY_ENV = "TOOLRUN_API_KEY"


def auth_metadata(api_key: Optional[str]) -> tuple:
    """The ``authorization`` metadata for ``api_key`` (or ``$TOOLRUN_API_KEY``); empty
    without a key (a gateway on loopback may run without authentication)."""
    key = (api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")).strip()
    return (("authorization", f"Bearer {key}"),) if key else ()


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class AuthInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the API key's metadata to every call of a synchronous channel."""

    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    def _details(self, d: Any) -> Any:
        return _CallDetails(
            d.method,
            d.timeout,
            list(d.metadata or ()) + list(self._metadata),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


_FORMATS: Dict[str, "pb.ToolFormat"] = {
    "openai": pb.TOOL_FORMAT_OPENAI,
    "anthropic": pb.TOOL_FORMAT_ANTHROPIC,
    "mcp": pb.TOOL_FORMAT_MCP,
    "openai-responses": pb.TOOL_FORMAT_OPENAI_RESPONSES,
    "openai_responses": pb.TOOL_FORMAT_OPENAI_RESPONSES,
    "ollama": pb.TOOL_FORMAT_OLLAMA,
    "gemini": pb.TOOL_FORMAT_GEMINI,
}

_MODES: Dict[str, "pb.ApprovalMode"] = {
    "none": pb.APPROVAL_MODE_NONE,
    "safe": pb.APPROVAL_MODE_SAFE,
    "all": pb.APPROVAL_MODE_ALL,
}

#: A call of ``call_many``: a :class:`Call`, ``(tool, arguments)`` or a dict with the
#: fields of :class:`Call`.
CallSpec = Union[Call, "tuple[str, Mapping[str, Any]]", Mapping[str, Any]]


def strip_address(address: str) -> str:
    """``http://host:port`` or ``https://host:port`` (as the CLI's TOOLRUN_ADDR) ->
    ``host:port`` for grpcio."""
    for scheme in ("http://", "https://", "grpc://"):
        if address.startswith(scheme):
            return address[len(scheme) :].rstrip("/")
    return address


#: The environment variables TLS settings are read from when not given (as the CLI's).
TLS_ENV = {
    "tls_ca": "TOOLRUN_TLS_CA",
    "tls_cert": "TOOLRUN_TLS_CERT",
    "tls_key": "TOOLRUN_TLS_KEY",
    "tls_server_name": "TOOLRUN_TLS_SERVER_NAME",
}

#: A PEM file's path, or its contents as bytes.
Pem = Union[str, "os.PathLike[str]", bytes]


def _pem(value: Optional[Pem]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def tls_channel(
    address: str,
    tls_ca: Optional[Pem],
    tls_cert: Optional[Pem],
    tls_key: Optional[Pem],
    tls_server_name: Optional[str],
) -> Optional[tuple]:
    """``(credentials, extra channel options)`` when the channel is TLS: an ``https://``
    address, or any TLS setting (argument or ``$TOOLRUN_TLS_*``); ``None`` for plain text.

    ``tls_ca``: CA certificates the gateway's certificate must chain to (default: grpcio's
    roots); ``tls_cert``/``tls_key``: the client certificate for mutual TLS (the gateway
    takes the caller's tenant from it); ``tls_server_name``: the name the gateway's
    certificate must carry (default: the address's host).
    """
    given = {"tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key, "tls_server_name": tls_server_name}
    for name, env in TLS_ENV.items():
        if given[name] is None and os.environ.get(env):
            given[name] = os.environ[env]
    if not address.startswith("https://") and not any(v is not None for v in given.values()):
        return None
    if address.startswith(("http://", "grpc://")):
        raise ValueError(
            f"TLS settings need an https:// or bare host:port address, not {address!r} "
            "(an http:// address would send the API key in clear)"
        )
    if (given["tls_cert"] is None) != (given["tls_key"] is None):
        raise ValueError("tls_cert and tls_key go together")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem(given["tls_ca"]),
        private_key=_pem(given["tls_key"]),
        certificate_chain=_pem(given["tls_cert"]),
    )
    options = []
    if given["tls_server_name"]:
        options.append(("grpc.ssl_target_name_override", str(given["tls_server_name"])))
    return credentials, options


def format_value(fmt: Optional[str]) -> "pb.ToolFormat":
    """The ToolFormat for a provider name; ValueError for an unknown one."""
    if fmt is None:
        return pb.TOOL_FORMAT_UNSPECIFIED
    try:
        return _FORMATS[fmt.lower()]
    except KeyError:
        raise ValueError(f"unknown tool format {fmt!r}; one of {sorted(_FORMATS)}") from None


def mode_value(mode: Optional[str]) -> "pb.ApprovalMode":
    """The ApprovalMode for ``"none"``, ``"safe"`` or ``"all"`` (None: the server's default)."""
    if mode is None:
        return pb.APPROVAL_MODE_UNSPECIFIED
    try:
        return _MODES[mode.lower()]
    except KeyError:
        raise ValueError(f"unknown approval mode {mode!r}; one of none, safe, all") from None


def timeout_ms(timeout: Optional[float]) -> int:
    """Seconds -> whole milliseconds (at least 1); None -> 0 (the tool's own timeout)."""
    if timeout is None:
        return 0
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return max(1, math.ceil(timeout * 1000))


def merge_arguments(
    arguments: Optional[Mapping[str, Any]], kwargs: Mapping[str, Any]
) -> Dict[str, Any]:
    """The call's arguments: the positional mapping updated with the keyword arguments."""
    merged: Dict[str, Any] = dict(arguments) if arguments is not None else {}
    merged.update(kwargs)
    return merged


def call_request(
    tool: str,
    arguments: Mapping[str, Any],
    *,
    session_id: Optional[str] = None,
    timeout: Optional[float] = None,
    call_id: Optional[str] = None,
) -> Any:
    """A ``CallToolRequest``; TypeError when the arguments are not JSON-serialisable."""
    if not isinstance(tool, str) or not tool:
        raise ValueError("tool must be a non-empty string")
    return pb.CallToolRequest(
        call_id=call_id or "",
        tool=tool,
        arguments_json=json.dumps(dict(arguments)),
        timeout_ms=timeout_ms(timeout),
        session_id=session_id or "",
    )


def to_call(spec: CallSpec) -> Call:
    """Normalises one entry of ``call_many``."""
    if isinstance(spec, Call):
        return spec
    if isinstance(spec, tuple):
        tool, arguments = spec
        return Call(tool=tool, arguments=dict(arguments))
    if isinstance(spec, Mapping):
        return Call(**dict(spec))
    raise TypeError(f"call_many takes Call, (tool, arguments) or dict entries, not {spec!r}")


def call_many_request(calls: Iterable[CallSpec], session_id: Optional[str]) -> Any:
    """A ``CallToolsRequest``; ``session_id`` applies to entries that name none."""
    reqs: List[Any] = []
    for spec in calls:
        c = to_call(spec)
        reqs.append(
            call_request(
                c.tool,
                c.arguments,
                session_id=c.session_id or session_id,
                timeout=c.timeout,
                call_id=c.call_id,
            )
        )
    return pb.CallToolsRequest(calls=reqs)


def message_json(message: Union[str, bytes, Mapping[str, Any], List[Any]]) -> str:
    """A provider message as JSON text (a dict/list is serialised, text passed as is)."""
    if isinstance(message, bytes):
        return message.decode("utf-8")
    if isinstance(message, str):
        return message
    return json.dumps(message)


def drop_none(**kw: Any) -> Dict[str, Any]:
    """The keyword arguments whose value is not None."""
    return {k: v for k, v in kw.items() if v is not None}


def run_code_arguments(
    code: str,
    language: str,
    args: Optional[List[str]],
    env: Optional[Mapping[str, str]],
    stdin: Optional[str],
    timeout: Optional[int],
) -> Dict[str, Any]:
    """run_code's arguments (its ``timeout`` is whole seconds, the tool's own limit)."""
    return drop_none(
        code=code,
        language=language,
        args=list(args) if args is not None else None,
        env=dict(env) if env is not None else None,
        stdin=stdin,
        timeout=timeout,
    )


R = TypeVar("R")


class SessionTools(Generic[R]):
    """The file and execution tools of a session, each a call with the session's id.

    Every method returns what :meth:`call` returns: a :class:`~toolrun.ToolResult` on a
    :class:`~toolrun.Session`, an awaitable of one on an :class:`~toolrun.AsyncSession`.
    Paths are relative to the workspace root, or absolute under ``/workspace``.
    """

    def call(self, tool: str, arguments: Optional[Mapping[str, Any]] = None, /, **args: Any) -> R:
        raise NotImplementedError

    def read_file(
        self,
        path: str,
        *,
        offset: Optional[int] = None,
        limit: Optional[int] = None,
        encoding: Optional[str] = None,
    ) -> R:
        """read_file: the file's lines numbered like ``cat -n`` (or base64 bytes)."""
        return self.call(
            "read_file", drop_none(path=path, offset=offset, limit=limit, encoding=encoding)
        )

    def write_file(
        self,
        path: str,
        content: str,
        *,
        create_dirs: Optional[bool] = None,
        encoding: Optional[str] = None,
    ) -> R:
        """write_file: creates or replaces the whole file (overwriting may ask approval)."""
        return self.call(
            "write_file",
            drop_none(path=path, content=content, createDirs=create_dirs, encoding=encoding),
        )

    def list_directory(
        self,
        path: str = ".",
        *,
        recursive: Optional[bool] = None,
        include_hidden: Optional[bool] = None,
    ) -> R:
        """list_directory: the entries of a directory (``"."``: the workspace root)."""
        return self.call(
            "list_directory",
            drop_none(path=path, recursive=recursive, includeHidden=include_hidden),
        )

    def delete_file(self, path: str, *, recursive: Optional[bool] = None) -> R:
        """delete_file: a file, an empty directory, or (recursive) a whole tree."""
        return self.call("delete_file", drop_none(path=path, recursive=recursive))

    def move_file(self, source: str, destination: str, *, overwrite: Optional[bool] = None) -> R:
        """move_file: renames ``source`` to ``destination``."""
        return self.call(
            "move_file", drop_none(**{"from": source, "to": destination, "overwrite": overwrite})
        )

    def glob(self, pattern: str, path: Optional[str] = None) -> R:
        """glob: paths matching ``pattern`` (``**`` crosses directories)."""
        return self.call("glob", drop_none(pattern=pattern, path=path))

    def grep(
        self,
        pattern: str,
        path: Optional[str] = None,
        *,
        glob: Optional[str] = None,
        case_insensitive: Optional[bool] = None,
        max_results: Optional[int] = None,
    ) -> R:
        """grep: lines matching a regular expression (ripgrep syntax)."""
        return self.call(
            "grep",
            drop_none(
                pattern=pattern,
                path=path,
                glob=glob,
                caseInsensitive=case_insensitive,
                maxResults=max_results,
            ),
        )

    def edit(
        self,
        path: str,
        old_string: str,
        new_string: str,
        *,
        replace_all: Optional[bool] = None,
    ) -> R:
        """edit: replaces ``old_string`` (which must occur once, unless ``replace_all``)."""
        return self.call(
            "edit",
            drop_none(
                path=path, old_string=old_string, new_string=new_string, replace_all=replace_all
            ),
        )

    def shell(
        self, command: str, *, cwd: Optional[str] = None, timeout_ms: Optional[int] = None
    ) -> R:
        """shell: ``bash -c command`` in the workspace (asks approval unless the mode allows)."""
        return self.call("shell", drop_none(command=command, cwd=cwd, timeout=timeout_ms))

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        args: Optional[List[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        timeout: Optional[int] = None,
    ) -> R:
        """run_code in the session's workspace (``timeout``: whole seconds)."""
        return self.call("run_code", run_code_arguments(code, language, args, env, stdin, timeout))
