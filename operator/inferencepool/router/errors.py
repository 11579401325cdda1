"""OpenAI-style error bodies and the exceptions that become them (pure)."""

from __future__ import annotations

import json

from inferencepool.router.http1 import Reply

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    414: "URITooLongError",
    431: "RequestHeaderFieldsTooLargeError",
    501: "NotImplementedError",
    505: "HTTPVersionNotSupportedError",
}


def error_body(message: str, error_type: str, status: int, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    ).encode()


def transport_error(status: int, message: str) -> bytes:
    """The body of an error the HTTP layer answers itself (unreadable or too large requests)."""
    return error_body(message, _ERROR_TYPES.get(status, "InternalServerError"), status)


def send_error(reply: Reply, message: str, error_type: str, status: int, param: str | None = None) -> None:
    reply.send(status, error_body(message, error_type, status, param))


class UpstreamError(Exception):
    """No pod could serve a leg; `status` is what the client gets (502 failed, 503 nothing available)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
