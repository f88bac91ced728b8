"""Run `bench/run.py` several times, alternating between variants, and print
each headline ratio per run with its median per variant.

One run's ratio moves by ±20% with the hour on a shared two-core machine,
so a change is judged on alternating runs, not on one:

    .venv/bin/python bench/compare.py --rounds 3 \\
        --variant cached:CREDENTIAL_CACHE_SECONDS=5 --variant asked:CREDENTIAL_CACHE_SECONDS=0 \\
        -- --only baseline --only sends --setups serve --seconds 6

A variant is a name and the environment its servers get (`NAME:KEY=VALUE,…`;
`bench/run.py` passes its own environment on to them). With no variant, the
code as it is runs `--rounds` times. To compare two commits, run this from a
worktree of each in turn.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def headlines(results: dict) -> dict[str, float]:
    """The figures the targets are set on, by name, from one results.json."""
    out: dict[str, float] = {}
    baseline = results.get("baseline", {})
    insert16 = next((row["tx_per_s"] for row in baseline.get("psycopg", []) if row["clients"] == 16), None)
    if insert16:
        out["insert tx/s, 16 clients"] = insert16
    for setup, row in results.get("sends", {}).items():
        if isinstance(row, dict) and "sends_per_s" in row:
            out[f"sends/s ({setup})"] = row["sends_per_s"]
            if insert16:
                out[f"sends/s ÷ insert tx/s ({setup})"] = row["sends_per_s"] / insert16
    ack = results.get("inbox", {}).get("ack")
    if ack and insert16:
        out["acks/s ÷ insert tx/s"] = ack["acks_per_s"] / insert16
    webhooks = results.get("webhooks", {})
    if "ratio_wakes_to_raw" in webhooks:
        out["wakes/s ÷ raw POSTs/s"] = webhooks["ratio_wakes_to_raw"]
        if "ratio_cluster_to_raw" in webhooks:
            out["wakes/s through the cluster ÷ raw POSTs/s"] = webhooks["ratio_cluster_to_raw"]
        for q in ("p50", "p99"):
            if (ratio := webhooks.get("latency", {}).get("ratio_to_send", {}).get(q)) is not None:
                out[f"webhook receipt ÷ send response, {q}"] = ratio
    for setup, row in results.get("live", {}).get("setups", {}).items():
        for q in ("p50", "p99"):
            if (ratio := row.get("ratios", {}).get(f"{q}_to_send")) is not None:
                out[f"frame ÷ send response, {q} ({setup})"] = ratio
        # Both sides of the ratio: a change can move it by slowing the send.
        for side, figure in (("frame", "frame"), ("send response", "send_response")):
            if (ms := row.get(figure, {}).get("p50_ms")) is not None:
                out[f"{side} p50 ms ({setup})"] = ms
    mcp = results.get("mcp", {})
    if "ratio_push_to_raw" in mcp.get("push", {}):
        out["pushed items/s"] = mcp["push"]["push"]["items_per_s"]
        out["pushed items/s ÷ raw POSTs/s"] = mcp["push"]["ratio_push_to_raw"]
        if mcp["push"].get("ratio_warm_push_to_raw") is not None:
            out["pushed items/s, warm, ÷ raw POSTs/s"] = mcp["push"]["ratio_warm_push_to_raw"]
        if mcp["push"].get("ratio_warm_cluster_to_raw") is not None:
            out["pushed items/s through the cluster, warm, ÷ raw POSTs/s"] = mcp["push"]["ratio_warm_cluster_to_raw"]
    for q, ratio in mcp.get("stream", {}).get("ratios", {}).items():
        out[f"stream event ÷ frame, {q}"] = ratio
    return out


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    env = {}
    for item in filter(None, assignments.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"not KEY=VALUE: {item!r}")
        env[key] = value
    if not name:
        raise argparse.ArgumentTypeError(f"a variant needs a name: {text!r}")
    return name, env


def run_once(bench_args: list[str], env: dict[str, str]) -> tuple[str, dict]:
    before = set(RESULTS.iterdir()) if RESULTS.exists() else set()
    completed = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), *bench_args], cwd=ROOT,
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    made = sorted(set(RESULTS.iterdir()) - before)
    if not made or not (made[-1] / "results.json").exists():
        raise SystemExit(f"bench/run.py wrote no results (exit {completed.returncode})")
    report = json.loads((made[-1] / "results.json").read_text())
    return report["stamp"], headlines(report["results"])


def fmt(value: float) -> str:
    return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, bench_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="NAME:KEY=VALUE,…")
    args = p.parse_args(ours)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    variants = args.variant or [("as is", {})]
    runs: dict[str, list[tuple[str, dict[str, float]]]] = {name: [] for name, _ in variants}
    for round_number in range(1, args.rounds + 1):
        for name, env in variants:
            print(f"round {round_number}, {name} …", file=sys.stderr, flush=True)
            runs[name].append(run_once(bench_args, env))
    figures = list(dict.fromkeys(f for got in runs.values() for _, heads in got for f in heads))
    print(f"`bench/run.py {' '.join(bench_args)}`, {args.rounds} alternating rounds\n")
    print("| figure | variant | runs | median |\n| --- | --- | --- | ---: |")
    for figure in figures:
        for name, got in runs.items():
            values = [heads[figure] for _, heads in got if figure in heads]
            if values:
                print(f"| {figure} | {name} | {', '.join(fmt(v) for v in values)} | {fmt(statistics.median(values))} |")
    print("\nRuns: " + "; ".join(f"{name}: {', '.join(stamp for stamp, _ in got)}" for name, got in runs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
