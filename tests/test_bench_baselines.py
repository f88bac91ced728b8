"""How the push and wake benchmarks count: the warm window of pushed items,
and the raw signed POSTs baseline taken on both sides of a measurement."""
import bench.webhooks
from bench.push import warm_rate, warm_window


def test_the_warm_window_starts_when_every_subscription_has_had_an_item():
    # given: two subscriptions; b's first item comes last, at 0.5; one item is received twice
    received = [("i1", "a", 0.1), ("i2", "a", 0.2), ("i3", "b", 0.5), ("i4", "a", 0.6),
                ("i5", "b", 0.7), ("i4", "a", 0.8), ("i6", "a", 0.9)]
    # when
    warm_from, items = warm_window(received, started=0.0)
    # then: from b's first item; i4, i5 and i6 came after it, i4 counted once
    assert (warm_from, items) == (0.5, 3)


def test_with_nothing_received_the_window_starts_at_the_go_signal():
    assert warm_window([], started=12.0) == (12.0, 0)


def test_a_run_too_short_to_warm_up_has_no_warm_figure():
    # given: one item per subscription, so every item is its subscription's first
    received = [("i1", "a", 0.1), ("i2", "b", 0.2)]
    # when / then: no item came after the window opened, and no rate is made of that
    assert warm_window(received, started=0.0) == (0.2, 0)
    assert warm_rate(0.2, 0, items=2, last=0.2) is None
    assert warm_rate(0.2, 9, items=10, last=1.2) == 9.0


def test_the_raw_baseline_is_the_mean_of_its_halves_either_side_of_the_measurement(monkeypatch):
    # given: raw POSTs that answer 100/s before the measurement and 300/s after it
    order = []

    async def raw_posts(url, seconds):
        order.append(("raw", seconds))
        answered = int((100 if len(order) == 1 else 300) * seconds)
        return answered, 0, [0.01] * answered

    monkeypatch.setattr(bench.webhooks, "_raw_posts", raw_posts)
    monkeypatch.setattr(bench.webhooks, "RAW_SETTLE_SECONDS", 0)
    # when
    raw, measured = bench.webhooks.raw_around("https://localhost:1/hook", 8.0,
                                              lambda: order.append(("measured",)) or "figure")
    # then: half the seconds on each side, in that order, and the rate between them
    assert order == [("raw", 4.0), ("measured",), ("raw", 4.0)]
    assert measured == "figure"
    assert raw["before_after_posts_per_s"] == [100.0, 300.0]
    assert raw["posts_per_s"] == 200.0
    assert raw["count"] == 1600
