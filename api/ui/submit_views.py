"""The dashboard's submit form: fields built from the tool's input schema
(``runyard.submission.schema_form``) or the raw JSON box, sent through the API's own submit
(``api.actions.runs``); errors come back on the form, by field where there is one."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError

from api.actions import runs as run_actions
from api.deps import Services, ServicesDep
from api.guard import BadJson, parse_json
from api.problems import Problem
from api.schemas import RunCreate
from api.ui.context import SessionDep, UiDep, check_csrf
from api.ui.views import form_pairs, page
from runyard.submission.schema_form import (
    MAX_FIELDS,
    WHOLE_INPUT,
    form_fields,
    form_values,
    read_form,
    schema_errors,
)
from runyard.tenancy.auth import Principal, may_run, priority_ceiling

router = APIRouter(prefix="/ui", include_in_schema=False)

FORM_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")
FIELD_PREFIX = "field."


def submit_context(
    services: Services,
    principal: Principal,
    tool: str | None,
    input_text: str,
    error: str | None,
    *,
    field_errors: dict[str, str] | None = None,
    field_values: dict[str, str] | None = None,
    from_fields: bool = False,
) -> dict[str, Any]:
    """What ``submit.html`` shows: every tool the key may run, with its fields (the chosen
    one's filled)."""
    registry = services.registry
    names = sorted(name for name in registry.tools if may_run(principal, name))
    chosen = tool if tool in names else None
    tools = [registry.tools[name] for name in names]
    fields = {t.name: form_fields(t.input_schema) for t in tools}
    values = {
        name: field_values if name == chosen and field_values is not None else form_values(spec, {})
        for name, spec in fields.items()
    }
    return {
        "title": "Submit a run",
        "tools": tools,
        "chosen": chosen or (tools[0].name if tools else None),
        "fields": fields,
        "values": values,
        "field_errors": field_errors or {},
        "whole_input_error": (field_errors or {}).get(WHOLE_INPUT),
        "input_text": input_text,
        "error": error,
        "from_fields": from_fields,
        # A fresh Idempotency-Key per form: submitting the same form twice makes one run.
        "form_key": secrets.token_urlsafe(16),
        "sync_mode": services.sync is not None,
    }


@router.get("/submit")
def submit_form(
    request: Request,
    services: ServicesDep,
    ui: UiDep,
    session: SessionDep,
    tool: str | None = None,
) -> HTMLResponse:
    """A form: pick a tool, fill its fields or write its JSON input."""
    chosen = tool if tool is not None and len(tool) <= 63 else None
    return page(
        ui, request, "submit.html", submit_context(services, session.principal, chosen, "{}", None)
    )


@router.post("/submit")
async def submit(
    request: Request, services: ServicesDep, ui: UiDep, session: SessionDep
) -> Response:
    """Submit through the API's own path (admission, idempotency, sync mode), then show it."""
    fields = dict(await form_pairs(request, MAX_FIELDS + 10))
    check_csrf(session, fields)
    tool = fields.get("tool", "")
    input_text = fields.get("input", "")
    definition = services.registry.tools.get(tool)
    schema = definition.input_schema if definition is not None else None
    spec = form_fields(schema)
    from_fields = fields.get("input_from") == "fields" and bool(spec)
    sent = {f.name: fields.get(FIELD_PREFIX + f.name, "") for f in spec} if from_fields else None

    def again(
        message: str,
        status_code: int,
        errors: dict[str, str] | None = None,
        shown: dict[str, str] | None = None,
    ) -> HTMLResponse:
        context = submit_context(
            services,
            session.principal,
            tool,
            input_text,
            message,
            field_errors=errors,
            field_values=sent if sent is not None else shown,
            from_fields=sent is not None,
        )
        return page(ui, request, "submit.html", context, status_code=status_code)

    value: Any
    if sent is not None:
        value, unreadable = read_form(spec, sent)
        problems = unreadable or schema_errors(schema, value)
        if problems:
            return again("Some fields need another look.", 422, problems)
        input_text = json.dumps(value, indent=2)
    else:
        try:
            value = parse_json(input_text.encode(), services.settings.max_json_depth)
        except BadJson as exc:
            return again(f"The input is not valid JSON: {exc.detail}", 422)
    try:
        body = RunCreate(tool=tool, input=value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return again(f"{where}: {first['msg']}", 422)
    form_key = fields.get("form_key", "")
    key = form_key if FORM_KEY.fullmatch(form_key) else None
    try:
        submitted = await run_actions.submit(
            request,
            services,
            body.request(
                session.principal.tenant,
                key,
                priority_ceiling(session.principal),
                session.principal.tools,
            ),
        )
    except Problem as exc:
        if exc.code != "invalid_input":
            return again(exc.detail, exc.status)
        # The fields show what the JSON said, each with what is wrong with it.
        return again(exc.detail, exc.status, schema_errors(schema, value), form_values(spec, value))
    return RedirectResponse(f"/ui/runs/{submitted.run.id}", status_code=303)
