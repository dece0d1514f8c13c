"""The desired-worker rule: out fast, in slowly with hysteresis, bounds, drain choice, and
Ray Serve's default policy."""

from __future__ import annotations

import itertools

import pytest

from compass.elastic.live import LiveDesired, Seen
from compass.elastic.rule import (
    RayServeConfig,
    RayServeRule,
    ScaleConfig,
    ScaleRule,
    Signals,
    WorkerLoad,
    parse_bounds,
    pick_drain,
    staffed,
    staffing_beta,
    util_at,
    workers_at,
    workers_for,
)
from compass.errors import ConfigError


def signals(now: float, current: int, rate: float, **kw: object) -> Signals:
    defaults: dict[str, object] = {"rate_short": rate, "rate_long": rate, "lane_s_per_job": 1.0}
    defaults.update(kw)
    return Signals(now, current, **defaults)  # type: ignore[arg-type]


def test_workers_for_is_the_capacity_model() -> None:
    assert workers_for(3.0, 1.0, 1, 0.6) == 5
    assert workers_for(3.0, 1.0, 1, 0.5) == 6
    assert workers_for(0.0, 1.0, 1, 0.5) == 1
    assert workers_for(6.0, 0.5, 2, 0.5) == 3


def test_square_root_staffing_spares_fewer_workers_as_the_cluster_grows() -> None:
    beta = staffing_beta(5, 0.3)  # 5 workers at 30% busy: the calibration point
    assert staffed(5 * 0.3, beta) == 5
    # ten times the work: ten times the workers at a fixed utilization, far fewer staffed
    assert workers_for(15.0, 1.0, 1, 0.3) == 50
    assert staffed(15.0, beta) == 27  # 15 + 2.86 * sqrt(15) = 26.07
    # the rule with staffing: out on the staffed need, in only below it at the lower band
    rule = ScaleRule(ScaleConfig(maximum=64, target_util=0.3, band=0.075, staffing=beta))
    assert rule.decide(signals(0.0, 5, 15.0)).desired == 27
    assert (
        ScaleConfig(target_util=0.3, band=0.075, staffing=beta).need(15.0, 1.0, 1, low=True) == 35
    )
    # off by default: the utilization target alone
    assert ScaleRule(ScaleConfig(target_util=0.3)).decide(signals(0.0, 5, 15.0)).desired == 50
    with pytest.raises(ConfigError, match="staffing must be"):
        ScaleConfig(staffing=-1.0)


TABLE = ((4, 0.2), (8, 0.4), (16, 0.5))


def test_utilization_by_size_interpolates_and_holds_past_its_ends() -> None:
    assert util_at(TABLE, 1) == 0.2 and util_at(TABLE, 4) == 0.2
    assert util_at(TABLE, 6) == pytest.approx(0.3)
    assert util_at(TABLE, 12) == pytest.approx(0.45)
    assert util_at(TABLE, 100) == 0.5
    # the fewest workers each held to its own size's utilization
    assert workers_at(0.0, TABLE) == 1
    assert workers_at(0.8, TABLE) == 4  # 4 at 0.2
    assert workers_at(3.2, TABLE) == 8  # 8 at 0.4; 7 would be at 0.46 against 0.35
    assert workers_at(8.0, TABLE) == 16
    assert workers_at(8.0, TABLE, most=10) == 10


def test_a_larger_cluster_is_held_to_its_own_utilization() -> None:
    """One utilization calibrated at 4 workers (0.2) asks 40 workers for 8 workers' worth of
    work; the table asks 16, and scales in at the same share below its own utilization."""
    one = ScaleConfig(maximum=64, target_util=0.2, band=0.02)
    sized = ScaleConfig(maximum=64, target_util=0.6, band=0.06, by_size=TABLE)
    assert one.need(8.0, 1.0, 1) == 40
    assert sized.need(8.0, 1.0, 1) == 16
    assert sized.need(8.0, 1.0, 1, low=True) == 18  # 8 / (0.9 * 0.5)
    assert ScaleRule(sized).decide(signals(0.0, 4, 8.0)).desired == 16
    for bad in (((8, 0.4), (4, 0.2)), ((4, 0.2), (4, 0.3)), ((0, 0.2),), ((4, 0.0),), ((4, 1.5),)):
        with pytest.raises(ConfigError, match="by_size needs"):
            ScaleConfig(by_size=bad)


def test_a_start_outrun_by_the_rate_is_called_off_at_once() -> None:
    """A spike asks for workers; it is gone before they are up: the starts are called off at
    the next step (no sustained surplus needed: they serve no one), serving workers are not."""
    rule = ScaleRule(ScaleConfig(maximum=20, target_util=0.5, band=0.1, in_after_s=30.0))
    assert rule.decide(signals(0.0, 4, 2.0)).desired == 4
    assert rule.decide(signals(2.0, 4, 0.0, rate_short=4.0, rate_long=2.0)).desired == 8
    after = rule.decide(signals(4.0, 8, 0.0, rate_short=2.0, rate_long=2.0, starting=4))
    assert (after.desired, after.reason) == (5, "call-off")  # 2 / 0.4 serving workers' worth
    # only the starts go: with one starting, the serving 7 wait for a sustained surplus
    rest = rule.decide(signals(6.0, 8, 0.0, rate_short=2.0, rate_long=2.0, starting=1))
    assert rest.desired == 7
    # under pressure, or with call_off off, a start stands
    pressed = rule.decide(signals(8.0, 8, 2.0, starting=4, waits={0: [1.5] * 4}, slack_s=2.0))
    assert pressed.desired >= 8
    kept = ScaleRule(ScaleConfig(maximum=20, target_util=0.5, band=0.1, call_off=False))
    assert kept.decide(signals(4.0, 8, 2.0, starting=4)).desired == 8


def test_bounds_parse_and_refuse_in_one_line() -> None:
    assert parse_bounds("2:8") == (2, 8)
    assert parse_bounds("3:3") == (3, 3)
    with pytest.raises(ConfigError, match=r"MIN \(5\) is above MAX \(2\)"):
        parse_bounds("5:2")
    for bad in ("0:4", "4", "a:b", "1:2:3", "-1:3"):
        with pytest.raises(ConfigError) as info:
            parse_bounds(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        ScaleConfig(minimum=4, maximum=2)


def test_scales_out_at_once_when_the_rate_rises() -> None:
    rule = ScaleRule(ScaleConfig(maximum=20, target_util=0.5))
    assert rule.decide(signals(0.0, 2, 1.0)).desired == 2
    jump = rule.decide(signals(2.0, 2, 4.0))
    assert (jump.desired, jump.reason) == (8, "out")
    assert rule.decide(signals(4.0, 8, 40.0)).desired == 20  # capped at the maximum


def test_waits_press_out_before_attainment_falls() -> None:
    rule = ScaleRule(ScaleConfig(maximum=20, target_util=0.5))
    calm = rule.decide(signals(0.0, 4, 1.0, waits={0: [0.0] * 4}, slack_s=2.0))
    assert calm.desired == 4 and not calm.pressure
    # the rate says 4 are enough, but the queues wait most of a job's slack: out by a step
    pressed = rule.decide(signals(2.0, 4, 1.0, waits={0: [1.5] * 4}, slack_s=2.0))
    assert pressed.pressure and pressed.desired == 5
    # a high priority waiting past the slack is pressure too
    high = rule.decide(signals(4.0, 5, 1.0, waits={0: [0.0] * 5, 2: [0, 0, 3.0, 0, 0]},
                               slack_s=2.0))  # fmt: skip
    assert high.pressure and high.desired > 5


def test_scales_in_only_after_a_sustained_surplus_and_in_steps() -> None:
    config = ScaleConfig(maximum=20, target_util=0.5, band=0.1, in_after_s=30.0, in_fraction=0.0)
    rule = ScaleRule(config)
    current = 10
    seen = []
    for step in range(40):
        now = step * 2.0
        current = rule.decide(signals(now, current, 1.0)).desired  # needs 3 at 0.4
        seen.append((now, current))
    first_in = next(t for t, n in seen if n < 10)
    assert first_in >= 30.0
    sizes = [n for _, n in seen]
    drops = [a - b for a, b in itertools.pairwise(sizes) if b < a]
    assert drops and all(d == 1 for d in drops)  # one worker per in_after_s
    assert sizes[-1] >= 3


def test_a_flapping_load_does_not_oscillate() -> None:
    """The load swings around the scale-out threshold every 10 s for 20 minutes: the size
    rises to cover the high phase and never goes back down while it flaps."""
    rule = ScaleRule(ScaleConfig(maximum=20, target_util=0.5, band=0.1, in_after_s=60.0))
    current = 4
    sizes = []
    for step in range(600):
        now = step * 2.0
        high = (step // 5) % 2 == 0
        rate_short = 2.4 if high else 1.6  # needs 5 at the high, 4 at the low
        current = rule.decide(signals(now, current, 0.0, rate_short=rate_short,
                                      rate_long=2.0)).desired  # fmt: skip
        sizes.append(current)
    changes = sum(1 for a, b in itertools.pairwise(sizes) if a != b)
    assert changes <= 1 and sizes[-1] == 5


def test_drain_never_drops_the_only_copy_of_a_hot_model() -> None:
    workers = [
        WorkerLoad("a", 0.0, frozenset({"opt"})),
        WorkerLoad("b", 0.1, frozenset({"vit", "opt"})),
        WorkerLoad("c", 0.2, frozenset({"vit", "detr"})),
    ]
    chosen, kept = pick_drain(workers, 2, hot={"opt", "vit", "detr"})
    # a goes (b still holds opt); b is then the only copy of opt; c the only one of detr
    assert chosen == ["a"] and set(kept) == {"opt", "detr"}
    # nothing hot: least loaded first, never the last worker
    assert pick_drain(workers, 5, hot=())[0] == ["a", "b"]


def test_ray_serve_rule_waits_its_delays() -> None:
    rule = RayServeRule(RayServeConfig(maximum=10), start=2)
    for now in range(0, 30, 2):
        rule.observe(float(now), ongoing=12.0)  # 6 replicas' worth at 2 each
        assert rule.decide(float(now)).desired == 2  # upscale_delay_s is 30 s
    rule.observe(30.0, 12.0)
    assert rule.decide(30.0).desired == 6
    for now in range(32, 630, 2):
        rule.observe(float(now), 2.0)
        assert rule.decide(float(now)).desired == 6  # downscale_delay_s is 600 s
    rule.observe(640.0, 2.0)
    assert rule.decide(640.0).desired == 1


def test_live_estimate_reads_busy_lanes_and_waits() -> None:
    live = LiveDesired(ScaleConfig(maximum=16, target_util=0.5), slack_s=1.0)
    idle = [Seen(0.0, 1, 0) for _ in range(4)]
    assert live.update(0.0, idle).desired == 4  # steady: no surplus sustained yet
    busy = [Seen(0.9, 1, 1) for _ in range(4)]
    decision = live.update(1.0, busy)
    assert decision.pressure and decision.desired > 4
