"""OpenAI-shaped errors (`{"error": {"message", "type", "param", "code"}}`) for every failure the
server answers with, the framework's own (a body that is not JSON, an unknown route) included.

A 5xx carries an error `id` that finds its entry, traceback and all, in the server log;
responses never carry tracebacks.  An engine-side failure carries its `Diagnosis` as
`error.diagnosis`, which clients read back with `Diagnosis.model_validate`.
"""
from __future__ import annotations

import logging
import traceback
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine.diagnosis import Diagnosis

log = logging.getLogger("lanekeeper.server")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", diagnosis: Diagnosis | None = None,
                 headers: dict | None = None, trace: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.diagnosis, self.headers = diagnosis, headers
        self.trace = trace or (diagnosis.traceback if diagnosis else None)
        self.error_id: str | None = None

    def body(self) -> dict:
        """The OpenAI error object.  A server error is logged here, once, under the id the client gets."""
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        if self.status >= 500:
            if self.error_id is None:
                self.error_id = "err_" + uuid.uuid4().hex[:16]
                detail = self.diagnosis.model_dump_json(exclude={"traceback"}) if self.diagnosis else ""
                log.error("%s: %d %s: %s %s%s", self.error_id, self.status, self.code, self.message, detail,
                          "\n" + self.trace if self.trace else "")
            err["id"] = self.error_id
            err["message"] = f"{self.message} (error id {self.error_id} in the server log)"
        if self.diagnosis is not None:
            err["diagnosis"] = self.diagnosis.public()
        return {"error": err}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def engine_error(diagnosis: Diagnosis, status: int | None = None, headers: dict | None = None) -> APIError:
    """An engine-side failure (stall, dead stage, ...) as a 5xx that carries the diagnosis."""
    if diagnosis.kind == "RequestFailed":   # the stage refused this request (e.g. longer than max_model_len)
        return APIError(400, diagnosis.message, "input", "request_refused", diagnosis=diagnosis)
    if status is None:
        status = 503 if diagnosis.kind in ("StageDied", "StageCrashed", "EngineClosed") else 500
    return APIError(status, diagnosis.message, code=diagnosis.kind, type_="server_error", diagnosis=diagnosis,
                    headers=headers)


def install_handlers(app: FastAPI) -> None:
    """Every error the app raises, or that the framework raises for it, answered as an APIError."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, message, code=code, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        trace = "".join(traceback.format_exception(exc))
        return APIError(500, f"internal server error ({type(exc).__name__})", code="internal_error",
                        type_="server_error", trace=trace).response()
