"""``Runyard`` and ``AsyncRunyard`` are one surface: the same public methods with the same
parameters, each async one awaitable where the sync one returns, async-iterable where it
iterates."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from runyard_client import AsyncRunyard, Runyard
from runyard_client.testing import AsyncFakeRunyard, FakeRunyard

# What legitimately differs between the flavours' annotations.
ASYNC_SPELLING = {
    "Iterator": "AsyncIterator",
    "BaseTransport": "AsyncBaseTransport",
    "Sandbox": "AsyncSandbox",
}


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def as_async(annotation: str) -> str:
    """The async flavour's spelling of a sync annotation."""
    for sync, spelled in ASYNC_SPELLING.items():
        annotation = re.sub(rf"\b{sync}\b", spelled, annotation)
    return annotation


def described(method: Callable[..., Any], *, to_async: bool = False) -> list[tuple[Any, ...]]:
    signature = inspect.signature(method)
    spell = as_async if to_async else (lambda text: text)
    return [
        (p.name, p.kind, p.default, spell(str(p.annotation))) for p in signature.parameters.values()
    ] + [("return", spell(str(signature.return_annotation)))]


def test_parity__both_flavours_have_the_same_public_methods():
    assert sorted(public_methods(Runyard)) == sorted(public_methods(AsyncRunyard))
    assert len(public_methods(Runyard)) >= 20


@pytest.mark.parametrize("name", [*sorted(public_methods(Runyard)), "__init__"])
def test_parity__each_method_has_the_same_signature(name: str):
    sync, other = getattr(Runyard, name), getattr(AsyncRunyard, name)
    assert described(sync, to_async=True) == described(other), name


@pytest.mark.parametrize("name", sorted(public_methods(Runyard)))
def test_parity__async_methods_are_awaitable_or_async_iterable(name: str):
    sync, other = getattr(Runyard, name), getattr(AsyncRunyard, name)
    returns = str(inspect.signature(sync).return_annotation)
    if name == "from_env":
        assert not inspect.iscoroutinefunction(other)  # a constructor, in both
    elif returns.startswith("Iterator["):
        # An async generator, or a plain method that returns one.
        assert not inspect.iscoroutinefunction(other), name
    else:
        assert inspect.iscoroutinefunction(other), name
        assert not inspect.iscoroutinefunction(sync), name


def test_parity__context_managers_in_both_flavours():
    assert hasattr(Runyard, "__enter__") and hasattr(Runyard, "__exit__")
    assert inspect.iscoroutinefunction(AsyncRunyard.__aenter__)
    assert inspect.iscoroutinefunction(AsyncRunyard.__aexit__)


def test_parity__the_fakes_are_the_real_clients():
    assert issubclass(FakeRunyard, Runyard) and issubclass(AsyncFakeRunyard, AsyncRunyard)
    assert inspect.signature(FakeRunyard) == inspect.signature(AsyncFakeRunyard)


@pytest.mark.parametrize(
    ("sync", "spelled"),
    [
        ("Iterator[Run]", "AsyncIterator[Run]"),
        ("httpx2.BaseTransport | None", "httpx2.AsyncBaseTransport | None"),
        ("builtins.list[Tool]", "builtins.list[Tool]"),
    ],
)
def test_as_async__table(sync: str, spelled: str):
    assert as_async(sync) == spelled
