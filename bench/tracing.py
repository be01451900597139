"""The CPU an attempt's spans cost the worker, alone: no database, no container, so the
figure is not drowned in the queue's own cost on a loaded machine.

Each round runs the span sites of one attempt's owner ``--jobs`` times in this process (the
``attempt`` span, the build-wait check, the context handed to the container, the
``finalize`` event and the outcome's attribute), paced at ``--rate`` attempts a second as a
worker would make them, with tracing off (``NO_TRACING``) and then on (``OtelTracing``,
every span exported through the OTLP/HTTP exporter to ``bench/otlp_sink.py`` on loopback);
the sides alternate round by round. The figure is the process's CPU per attempt (the
exporter's thread included) and its difference between the sides, which is what tracing
adds to each job of ``bench.queue``.

``python -m bench.tracing --jobs 20000 --rounds 4 --rate 400``
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime

from bench.otlp_sink import otlp_sink
from runyard.attempts.traced import trace_build_wait, trace_finalize, traced_attempt
from runyard.platform.otel import OtelTracing
from runyard.platform.tracing import NO_TRACING, Tracing, install, tracing
from runyard.queue import ClaimedJob
from runyard.queue.builds import BuildQueue


def _job() -> ClaimedJob:
    now = datetime.now(UTC)
    return ClaimedJob(
        job_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        attempt=1,
        max_attempts=3,
        lease_token=uuid.uuid4(),
        locked_until=now,
        deadline_at=now,
        cancel_requested=False,
        adopted=False,
        spec={"name": "noop", "image": "runyard/toolbox:latest"},
        input={},
    )


def _engine_id() -> str:
    return "bench"


def cpu_per_job(traced: Tracing, jobs: int, rate: float) -> float:
    """Microseconds of this process's CPU per attempt's span sites, ``traced`` installed."""
    install(traced)
    builds = BuildQueue(None)  # type: ignore[arg-type]  # never read: no build in the spec
    job = _job()

    def one() -> None:
        with traced_attempt(job, "bench-worker"):
            trace_build_wait(job, _engine_id, builds)
            tracing().current()
            trace_finalize("succeeded")

    try:
        for _ in range(min(jobs, 500)):
            one()
        start_cpu, start = time.process_time(), time.monotonic()
        for n in range(jobs):
            one()
            if n % 40 == 0:  # paced: the exporter's batches as a worker's rate makes them
                time.sleep(max(0.0, start + n / rate - time.monotonic()))
        if traced is not NO_TRACING:
            traced.shutdown()  # the last batch's export counts too
        return (time.process_time() - start_cpu) / jobs * 1e6
    finally:
        install(NO_TRACING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=float, default=400.0, help="attempts a second")
    args = parser.parse_args(argv)
    off: list[float] = []
    on: list[float] = []
    with otlp_sink() as url:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        for n in range(args.rounds):
            sides = ("off", "on") if n % 2 == 0 else ("on", "off")
            for side in sides:
                if side == "off":
                    off.append(cpu_per_job(NO_TRACING, args.jobs, args.rate))
                else:
                    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces")
                    on.append(cpu_per_job(OtelTracing("bench", exporter), args.jobs, args.rate))
                print(f"[bench] round {n} {side}: {(off if side == 'off' else on)[-1]:.1f} us/job")  # noqa: T201
    median_off, median_on = statistics.median(off), statistics.median(on)
    print(  # noqa: T201
        f"tracing CPU per attempt: off {median_off:.1f} us, on {median_on:.1f} us, "
        f"added {median_on - median_off:.1f} us (medians of {args.rounds} rounds of {args.jobs})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
