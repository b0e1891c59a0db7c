"""`make bench`'s probe of the machine's own speed (bench/common.py): taken before every
measured run, so a report says when the VM changed speed under it."""

from __future__ import annotations

from bench.common import speed_probe, speed_spread


def test_the_probe_measures_cpu_for_a_fixed_amount_of_work() -> None:
    small, large = speed_probe(loops=200_000), speed_probe(loops=2_000_000)
    assert 0 < small < large


def test_the_spread_is_the_slowest_probe_over_the_fastest() -> None:
    assert speed_spread([30.0, 33.0, 39.0]) == {"probes": 3, "min_ms": 30.0, "max_ms": 39.0,
                                                "spread": 0.3}
    assert speed_spread([])["spread"] is None
