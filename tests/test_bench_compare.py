"""`bench/compare.py`: the figures it reads from one run's results.json."""
from bench.compare import headlines


def test_a_live_row_carries_both_sides_of_its_ratio():
    # given: one live setup's results as bench/live.py writes them
    results = {"live": {"setups": {"1proc": {"ratios": {"p50_to_send": 1.4, "p99_to_send": 1.1},
                                             "frame": {"p50_ms": 9.8, "p99_ms": 20.0},
                                             "send_response": {"p50_ms": 7.0, "p99_ms": 18.2}}}}}
    # when / then: the ratios, and the frame's and the send's own p50 (a ratio can improve by slowing the send)
    assert headlines(results) == {
        "frame ÷ send response, p50 (1proc)": 1.4, "frame ÷ send response, p99 (1proc)": 1.1,
        "frame p50 ms (1proc)": 9.8, "send response p50 ms (1proc)": 7.0,
    }
