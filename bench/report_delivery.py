"""The report's sections on deliveries (bench/report.py): webhook wakes,
and the MCP stream and pushed inbox items."""
from __future__ import annotations

from bench.fmt import fmt, verdict

TARGET_STREAM_TO_FRAME = 1.5  # MCP stream event latency / WebSocket frame latency, p50 and p99
TARGET_PUSH_TO_RAW = 0.5      # pushed inbox items/s / raw signed POSTs/s


def webhooks_markdown(r: dict, cfg: dict) -> list[str]:
    if "error" in r:
        return [f"### Webhooks: failed: {r['error']}", ""]
    raw, wakes, lat = r["raw"], r["wakes"], r["latency"]

    def rounds_of(result: dict) -> str:
        return ", ".join(f"{x['wakes']} in {x['seconds']} s{' (warm-up, not counted)' if x['warmup'] else ''}"
                         for x in result["rounds"])

    rounds = rounds_of(wakes)
    cluster_row = []
    if c := r.get("cluster"):
        sent = runs_sent(c["runs_sent"])
        cluster_row = [f"| the same through `serve`'s worker cluster ({c['workers']} processes: the timer, and the "
                       f"helpers it asks for; rounds {rounds_of(c)}; sent by the finished runs: {sent}) | "
                       f"{fmt(c['wakes_per_s'])} | the same | {fmt(r['ratio_cluster_to_raw'], 2)} |"]
    return [f"### Webhook wakes to a local HTTPS receiver ({wakes['subscriptions']:,} active subscriptions, "
            f"{wakes['endpoints']} endpoints, {wakes['workers']} worker processes)", "",
            "| figure | value | baseline: raw signed POSTs/s, one process, 64 in flight (before / after, mean) "
            "| ratio |",
            "| --- | ---: | ---: | ---: |",
            f"| wakes/s (claim, sign, POST, record) | {fmt(wakes['wakes_per_s'])} | "
            f"{' / '.join(fmt(v) for v in raw['before_after_posts_per_s'])}, {fmt(raw['posts_per_s'])} "
            f"| {fmt(r['ratio_wakes_to_raw'], 2)} |",
            *cluster_row, "",
            f"Rounds: {rounds}; attempts recorded {wakes['attempts']:,}, delivered {wakes['delivered']:,}. "
            f"Raw POSTs: {raw['errors']} errors, p50 {fmt(raw['p50_ms'], 1)} ms, counted after a "
            f"{raw['warmup_s']} s warm-up.", "",
            f"Send-to-receipt latency at debounce 0 (`serve`: its ASGI server and the django-q2 cluster; {lat['sends']} sends, "
            f"one at a time): p50 {fmt(lat['p50_ms'], 1)} ms, p99 {fmt(lat['p99_ms'], 1)} ms "
            f"({lat['covered']} of {lat['sends']} covered by {lat['wakes']} wakes); the sends' own responses p50 "
            f"{fmt(lat['send_response']['p50_ms'], 1)} ms, p99 {fmt(lat['send_response']['p99_ms'], 1)} ms: receipt / "
            f"response **{fmt(lat['ratio_to_send'].get('p50'), 2)} / {fmt(lat['ratio_to_send'].get('p99'), 2)}** "
            "(target ≤ 2).", ""]


def runs_sent(runs: dict[str, list]) -> str:
    """What each finished run of a worker cluster sent, by task: `deliver 1280, 0; assist 720`."""
    return "; ".join(f"{name} {', '.join(str(n) for n in sent) or 'none'}" for name, sent in runs.items())


def mcp_markdown(r: dict) -> list[str]:
    if "error" in r:
        return [f"### MCP: failed: {r['error']}", ""]
    lines = ["### MCP: send → `events/stream` event, and pushed inbox items", "",
             "| figure | value | baseline in the same run | ratio | target | met |",
             "| --- | ---: | --- | ---: | --- | --- |"]
    s = r.get("stream", {})
    if "error" in s:
        lines.append(f"| send → stream event | failed: {s['error'][:120]} | | | | |")
    elif s:
        e, f, ratios = s["stream"]["event"], s["websocket"]["frame"], s["ratios"]
        ok = (len(ratios) == 2 and max(ratios.values()) <= TARGET_STREAM_TO_FRAME
              and not s["stream"]["errors"] and not s["stream"]["timeouts"])
        lines.append(f"| send → `events/stream` event of `inbox.item` (SDK client), p50 / p99 ms, {s['sends']} direct "
                     f"messages one at a time | {fmt(e['p50_ms'])} / {fmt(e['p99_ms'])} | send → WebSocket frame, "
                     f"1 client, same server and kind of send: {fmt(f['p50_ms'])} / {fmt(f['p99_ms'])} | "
                     f"{fmt(ratios.get('p50'), 2)} / {fmt(ratios.get('p99'), 2)} | ≤ {TARGET_STREAM_TO_FRAME} | "
                     f"{verdict(ok)} |")
    p = r.get("push", {})
    if "error" in p:
        lines.append(f"| pushed items/s | failed: {p['error'][:120]} | | | | |")
    elif p:
        push, raw = p["push"], p["raw"]
        # On the warm figure; on the cold one where the run was too short to have one.
        judged = p["ratio_push_to_raw"] if p["ratio_warm_push_to_raw"] is None else p["ratio_warm_push_to_raw"]
        ok = judged >= TARGET_PUSH_TO_RAW and push["unique"] == push["items"]
        what = (f"pushed `inbox.item` items/s, {push['subscriptions']} subscriptions × {push['items_each']} items, "
                f"{push['workers']} worker processes{' (profiled: slower)' if push['profiles'] else ''}")
        baseline = (f"raw signed POSTs/s to the same receiver, one process, 64 in flight, before / after: "
                    f"{' / '.join(fmt(v) for v in raw['before_after_posts_per_s'])}, mean {fmt(raw['posts_per_s'])}")
        lines.append(f"| {what}, warm (after every subscription's first item) | {fmt(push['warm_items_per_s'])} | "
                     f"{baseline} | {fmt(p['ratio_warm_push_to_raw'], 2)} | ≥ {TARGET_PUSH_TO_RAW} | {verdict(ok)} |")
        lines.append(f"| the same from the go signal (connections opened on the way) | {fmt(push['items_per_s'])} | "
                     f"the same | {fmt(p['ratio_push_to_raw'], 2)} | – | – |")
        if c := p.get("cluster"):
            lines.append(f"| the same through `serve`'s worker cluster ({c['workers']} processes: the timer, and the "
                         f"helper it asks for), warm | {fmt(c['warm_items_per_s'])} | the same | "
                         f"{fmt(p.get('ratio_warm_cluster_to_raw'), 2)} | – | – |")
    lines.append("")
    if s and "error" not in s:
        st, ws = s["stream"], s["websocket"]
        lines += [f"Send response p50 / p99: {fmt(st['send_response']['p50_ms'])} / {fmt(st['send_response']['p99_ms'])}"
                  f" ms (stream) and {fmt(ws['send_response']['p50_ms'])} / {fmt(ws['send_response']['p99_ms'])} ms "
                  f"(WebSocket). Stream: {st['events']} events for {st['sends']} sends ({st['missing']} missing, "
                  f"{st['duplicates']} duplicate, {st['timeouts']} timeouts); WebSocket: {ws['frames']} frames. "
                  f"Server peak RSS {fmt(s['server_peak_rss_mib'], 0)} MiB, server CPU {s['server_cpu_cores']:.2f} "
                  "cores.", ""]
    if p and "error" not in p:
        push = p["push"]
        busy = "; ".join(f"{100 * t['busy_share']:.0f}% (" + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                                        list(t["seconds"].items())[:2]) + ")"
                         for t in push["db_threads"])
        lines += [f"Pushes: {push['unique']:,} of {push['items']:,} items in {push['seconds']} s from the go signal "
                  f"(first after {push['first_receipt_s']} s; every subscription's first by {push['warm_from_s']} s, "
                  f"{push['warm_items']:,} items after it), {push['duplicates']} duplicates, "
                  f"{push['pending_left']} left pending, {push['attempts']:,} attempts; deliveries by state "
                  f"{push['deliveries']}; {push['cancelled_after_last']} cancelled in the "
                  f"{push['seconds_after_last']} s after the last item; kicks queued {p['kicks_queued']}. "
                  f"Machine CPU busy {push['machine_cpu_cores']:.2f} cores; the workers' database threads busy "
                  f"{busy}." + (" Split of the chains (items, subscriptions, last send s): " + "; ".join(
                      f"{w['items']:,}, {w['subscriptions']}, {w['last_send_s']}" for w in push["workers_split"])
                      if push.get("workers_split") else ""), ""]
        if c := p.get("cluster"):
            runs = runs_sent(c["runs_sent"])
            lines += [f"Through the cluster: {c['unique']:,} of {c['items']:,} items in {c['seconds']} s from the "
                      f"delivery task's queueing (every subscription's first by {c['warm_from_s']} s, "
                      f"{c['warm_items']:,} after it), {c['duplicates']} duplicates, {c['pending_left']} left pending; "
                      f"machine CPU busy {c['machine_cpu_cores']:.2f} cores; items sent by the finished runs: {runs} "
                      "(the timer's run ends with the cluster).", ""]
    return lines
