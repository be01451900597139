"""A command's output as progress notifications, while a sandbox tool waits for it: the
chunks its sandbox's owner stores, in the order they were stored, as the run tools send a
run's logs (the same caps per message and per call)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from api.actions.sandboxes import CHUNK_PAGE, EXEC_POLL_MAX_SECONDS, store_of
from api.deps import Services
from api.mcp.runs import (
    PROGRESS_MESSAGE_CHARS,
    PROGRESS_TOTAL_CHARS,
    Follower,
    Progress,
    nap,
    sent_progress,
    with_followers,
)

T = TypeVar("T")


async def with_output(
    services: Services,
    ids: tuple[uuid.UUID, uuid.UUID],
    progress: Progress | None,
    work: Callable[[], Awaitable[T]],
) -> T:
    """``work``'s answer, the command's output sent as ``progress`` (if the client asked for
    it) until then, and its last bytes within a bound before the answer goes."""
    if progress is None:
        return await work()

    async def followed(start: Callable[[Follower], None]) -> T:
        start(functools.partial(_send_output, services, ids, progress))
        return await work()

    return await with_followers(followed)


async def _send_output(
    services: Services,
    ids: tuple[uuid.UUID, uuid.UUID],
    progress: Progress,
    finished: anyio.Event,
) -> None:
    """Send the command's stored output until ``finished`` (then once more, for the last
    bytes), or the cap; ``progress`` counts the characters sent so far."""
    sandbox_id, exec_id = ids
    store = store_of(services)
    ends = {"stdout": 0, "stderr": 0}
    sent = 0
    with services.notifier.subscribe(sandbox_id) as woken:
        while sent < PROGRESS_TOTAL_CHARS:
            last = finished.is_set()
            chunks = await anyio.to_thread.run_sync(
                store.chunks_from, exec_id, ends["stdout"], ends["stderr"], CHUNK_PAGE
            )
            for chunk in chunks:
                ends[chunk.stream] = chunk.offset + chunk.length
                text = chunk.data.decode("utf-8", "replace")[: PROGRESS_TOTAL_CHARS - sent]
                for offset in range(0, len(text), PROGRESS_MESSAGE_CHARS):
                    piece = text[offset : offset + PROGRESS_MESSAGE_CHARS]
                    sent += len(piece)
                    if not await sent_progress(progress, float(sent), piece):
                        return
            if len(chunks) == CHUNK_PAGE:
                continue
            if last:
                return
            await nap(woken, finished, EXEC_POLL_MAX_SECONDS)
