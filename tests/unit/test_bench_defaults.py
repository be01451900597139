"""With no flags, the flat-drain and the container benchmarks measure what they document."""

from __future__ import annotations

from bench import containers, queue, sandboxes


def test_bench_queue__no_flags_is_the_flat_drain_against_procrastinate():
    args = queue.build_parser().parse_args([])
    assert (args.history, args.rounds, args.jobs) == (100_000, 6, 5000)
    assert args.sides.split(",") == ["runyard-worker", "procrastinate"]
    assert args.database_url is None and args.server_url is None  # an embedded Postgres


def test_bench_containers__no_flags_is_runyards_default_configuration():
    args = containers.build_parser().parse_args([])
    assert args.inputs == "auto"  # the worker gets no input setting, as a deployment
    assert args.concurrency == "1,2,4"
    assert args.database_url is None and args.server_url is None


def test_bench_sandboxes__no_flags_is_the_documented_run():
    args = sandboxes.build_parser().parse_args([])
    assert (args.creates, args.execs, args.file_mb) == (8, 200, 64)
    assert args.database_url is None and args.server_url is None


def test_bench_containers__its_verdict_holds_each_target_at_every_concurrency() -> None:
    from bench.containers import verdict_line

    met = verdict_line({1: 0.97, 2: 0.95}, {1: 12.0, 2: 30.0}, {1: 4.9, 2: 5.0}, {1: 2.0, 2: 1.5})
    assert met.count(" met ") == 4 and "missed" not in met, met
    one_short = verdict_line({1: 0.97, 2: 0.94}, {1: 12.0, 2: 31.0}, {1: 5.1}, {1: 2.0})
    assert "c2=0.940 missed" in one_short and "c2=+31 missed" in one_short, one_short
    assert "c1=5.1 missed" in one_short and "c1=2.0 met" in one_short, one_short
    assert "missed" in verdict_line({}, {}, {}, {}).split(";")[0]
