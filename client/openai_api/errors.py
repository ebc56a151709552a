"""Errors of the OpenAI-compatible API, in the shape OpenAI's clients read.

Every failure is a JSON body ``{"error": {"message", "type", "param", "code"}}`` with the status
OpenAI uses for it: 400 for a bad request, 401 for a missing or refused API key, 404 for an
unknown model or route, 429 for a quota, 500 for a failure of the server or the inferlet, 503 for
a server that stopped answering or dropped the request's connection.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from oven.client.rpc import ControlRequestError

INVALID_REQUEST, AUTHENTICATION, RATE_LIMIT, SERVER = (
    "invalid_request_error", "authentication_error", "rate_limit_error", "server_error")


class ApiError(Exception):
    """A request that fails with ``status``; the message is meant for the API's user as it is."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param, code)


def bad_key(message: str) -> ApiError:
    return ApiError(401, message, AUTHENTICATION, None, "invalid_api_key")


# Whoever a refusal or a timeout reaches may be no client of the server: its replies name no endpoint,
# socket path or file of the server (an OvenClient's errors do, for the person at its terminal).
def refused_key() -> ApiError:
    return bad_key("Incorrect API key provided: this server does not admit it. An API key of this server is an "
                   "oven token that its operator made (see `oven token add`).")


def not_answering() -> ApiError:
    return ApiError(503, "The oven server did not answer in time; try again later.", SERVER)


# What the control server's refusals mean to an API user (the rest are the server's fault: 500).
_BY_CONTROL_CODE = {
    "too_many_instances": (429, RATE_LIMIT, "rate_limit_exceeded"),
    "upload_busy": (429, RATE_LIMIT, "rate_limit_exceeded"),
    "forbidden": (403, INVALID_REQUEST, "forbidden"),
    "dropped": (503, SERVER, None),  # the session's connection starved past its lease: try again
}


def from_control(exc: ControlRequestError) -> ApiError:
    status, type_, code = _BY_CONTROL_CODE.get(exc.code, (500, SERVER, None))
    return ApiError(status, str(exc), type_, None, code)
