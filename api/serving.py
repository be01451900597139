"""The API's uvicorn server, whose housekeeping wakes once a second instead of ten times."""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

# How often the idle server wakes to refresh its Date header and see whether it should stop.
TICK_SECONDS = 1.0
# uvicorn refreshes the Date header when its tick counter is a multiple of this.
_TICKS_PER_DATE = 10
_COUNTER_WRAP = 864_000


class QuietServer(uvicorn.Server):
    """``uvicorn.Server`` whose tick runs every ``tick_seconds``, not every 0.1 s.

    uvicorn's tick only refreshes the Date header (once a second) and checks the exit flag
    and the request limit; ten wake-ups a second cost an idle API most of its CPU. An exit
    asked for (a signal, or ``should_exit`` set from another thread) wakes the loop at once,
    so a stop is as quick as before.
    """

    def __init__(self, config: uvicorn.Config, tick_seconds: float = TICK_SECONDS) -> None:
        self._tick_seconds = tick_seconds
        self._exit_flag = False
        self._exit_asked: asyncio.Event | None = None
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        """Whether the server should stop; setting it wakes the tick."""
        return self._exit_flag

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_flag = value
        loop, asked = self._serving_loop, self._exit_asked
        if value and loop is not None and asked is not None:
            # From a signal handler or another thread: only the loop's thread-safe hand-off.
            # A loop that closed meanwhile has nothing left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(asked.set)

    async def main_loop(self) -> None:
        """uvicorn's tick loop, waking every ``tick_seconds`` or when asked to exit."""
        self._exit_asked = asyncio.Event()
        self._serving_loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # Every tick is a multiple of uvicorn's date period: each one refreshes the header.
            counter = (counter + _TICKS_PER_DATE) % _COUNTER_WRAP
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), self._tick_seconds)
            should_exit = await self.on_tick(counter)
