"""A pure ASGI guard in front of the app: size, media type and JSON shape, before any parsing.

It rejects a body larger than the limit from its ``Content-Length`` without reading it, and
counts the bytes of a body sent without one; a body of another media type is 415. A JSON body
is checked once here: malformed, duplicate keys, deeper than the limit, non-finite numbers,
NUL characters or lone surrogates (which Postgres cannot store) are rejected with a problem
document naming the field. Under the dashboard's prefix a body must be a url-encoded form
instead (and is not parsed here). The app downstream receives the same bytes. A file sent
into a sandbox (``PUT /v1/sandboxes/{id}/files/...``) is a raw stream its route caps itself.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import problem_response

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Uploads into a sandbox: streamed to their route, which counts the bytes against its cap.
RAW_BODY_PATH = re.compile(r"^/v1/sandboxes/[^/]+/files/")


class BadJson(Exception):
    """The body is not acceptable JSON; carries the problem's status, code and field."""

    def __init__(self, status: int, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BadJson(400, "duplicate_key", f"the key {key[:64]!r} appears twice", key[:64])
        result[key] = value
    return result


def _check_text(value: str, path: str) -> None:
    if "\x00" in value:
        raise BadJson(
            422, "nul_character", f"{path or 'body'}: NUL characters are not allowed", path
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadJson(
            422, "invalid_unicode", f"{path or 'body'}: lone surrogates are not allowed", path
        ) from exc


def may_hold_bad_text(body: bytes) -> bool:
    """Whether a body that parsed may hold a NUL or a lone surrogate in a string. In UTF-8
    only an escape (``\\u0000``, ``\\udfff``) or the encoded form of a surrogate (its lead
    byte 0xED, which Hangul syllables share) can bring one in; a body with a NUL byte is not
    UTF-8 JSON (the parser also takes UTF-16 and UTF-32)."""
    return b"\\u" in body or b"\xed" in body or b"\x00" in body


def check_json(document: Any, max_depth: int, *, texts: bool = True) -> None:
    """Walk the parsed document without recursion: depth, and (``texts``) NUL and surrogate
    checks of every key and string."""
    stack: list[tuple[Any, str, int]] = [(document, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise BadJson(400, "json_too_deep", f"JSON nested deeper than {max_depth}", path)
            if not texts:  # the depth alone: only containers go on the stack
                stack.extend(
                    (item, path, depth + 1)
                    for item in value.values()
                    if isinstance(item, dict | list)
                )
                continue
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                _check_text(key, child)
                stack.append((item, child, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                raise BadJson(400, "json_too_deep", f"JSON nested deeper than {max_depth}", path)
            stack.extend(
                (item, f"{path}[{i}]" if texts else path, depth + 1)
                for i, item in enumerate(value)
                if texts or isinstance(item, dict | list)
            )
        elif isinstance(value, str):
            _check_text(value, path)


def parse_json(body: bytes, max_depth: int) -> Any:
    """Parse and check a request body; raises ``BadJson``."""
    try:
        document = json.loads(
            body,
            object_pairs_hook=_unique_keys,
            parse_float=_finite_float,
            parse_constant=_reject_constant,
        )
    except RecursionError as exc:
        raise BadJson(400, "json_too_deep", f"JSON nested deeper than {max_depth}") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, out-of-range numbers
        raise BadJson(400, "invalid_json", f"the body is not valid JSON: {exc}"[:300]) from exc
    if may_hold_bad_text(body):
        check_json(document, max_depth)
    else:
        try:
            check_json(document, max_depth, texts=False)
        except BadJson:
            check_json(document, max_depth)  # again with paths, for the problem's field
    return document


def is_form_media_type(content_type: str) -> bool:
    """``application/x-www-form-urlencoded``, parameters ignored."""
    return content_type.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or any ``application/*+json``, parameters ignored."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class RequestGuard:
    """See the module docstring; every refusal is an ``application/problem+json`` answer."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_json_depth: int = 64,
        form_path_prefix: str | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        # The dashboard's HTML forms post url-encoded bodies under this prefix, JSON nowhere.
        self.form_path_prefix = form_path_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if b"\x00" in scope.get("query_string", b"") or b"%00" in scope.get("query_string", b""):
            await problem_response(
                400, "nul_character", "NUL characters are not allowed in the query"
            )(scope, receive, send)
            return
        if scope["method"] == "PUT" and RAW_BODY_PATH.match(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length_header = headers.get(b"content-length")
        if length_header is not None:
            try:
                length = int(length_header)
                if length < 0:
                    raise ValueError(length)
            except ValueError:
                await problem_response(400, "invalid_content_length", "bad Content-Length")(
                    scope, receive, send
                )
                return
            if length > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if scope["method"] not in BODY_METHODS or not (chunked or (length_header or b"0") != b"0"):
            await self.app(scope, receive, send)
            return

        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
        if body:
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            if self.form_path_prefix and str(scope.get("path", "")).startswith(
                self.form_path_prefix
            ):
                if not is_form_media_type(content_type):
                    await problem_response(
                        415,
                        "unsupported_media_type",
                        "send the form as application/x-www-form-urlencoded",
                        field="Content-Type",
                    )(scope, receive, send)
                    return
            elif not is_json_media_type(content_type):
                await problem_response(
                    415,
                    "unsupported_media_type",
                    "send the body as application/json",
                    field="Content-Type",
                )(scope, receive, send)
                return
            else:
                try:
                    parse_json(bytes(body), self.max_json_depth)
                except BadJson as exc:
                    await problem_response(exc.status, exc.code, exc.detail, field=exc.field)(
                        scope, receive, send
                    )
                    return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            # After the body: the server's own receive reports the client's disconnect.
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await problem_response(
            413,
            "body_too_large",
            f"the request body is larger than {self.max_body_bytes} bytes",
            headers={"Connection": "close"},
        )(scope, receive, send)
