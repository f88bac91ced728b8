"""The Markdown report of a benchmark run (results.json → tables)."""
from __future__ import annotations

from bench.fmt import fmt, verdict
from bench.report_delivery import mcp_markdown, webhooks_markdown
from controlplane.keys import redis_namespace

# A fixed root key for the run (bench/run.py gives it to every server):
# cursors built here must verify in the servers, and the Redis names are its.
ADMIN_KEY = "bench-only-server-admin-key-0123456789abcdefghijklmnopqrstuvwxyz"
# Every server process subscribes to the log topic once (controlplane.topics.redis_channel).
LOG_TOPIC_CHANNEL = f"{redis_namespace(ADMIN_KEY)}:topic:switchboard.log"
TARGET_SENDS_SHARE = 0.08  # sends/s / 16-client insert tx/s (issue: ≥ 8%)
TARGET_RSS_MIB = 120
TARGET_FEED_RATIO = 1.3
TARGET_FRAME_P50_MS, TARGET_FRAME_P99_MS = 17, 37


def log_topic_subscribers(url: str | None) -> int | None:
    """How many processes listen to the log topic on Redis (None without Redis)."""
    if not url:
        return None
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            return dict(client.pubsub_numsub(LOG_TOPIC_CHANNEL)).get(LOG_TOPIC_CHANNEL.encode(), 0)
    except redis.RedisError:
        return None


def markdown(report: dict) -> str:
    m, res, cfg = report["machine"], report["results"], report["config"]
    lines = [f"## Switchboard benchmark {report['stamp']}", "",
             f"{m['nproc']} cores · {m['mem_total']} · {m['cpu_model']} · {m['postgresql'].split(' on ')[0]} · "
             f"Python {m['python']} · Django {m['django']} · commit {m['git_commit']} · "
             f"redis {cfg['redis'] or 'off'} · {cfg['clients']} clients · load average at start "
             f"{m['loadavg_at_start'][0]:.2f}, at end {m['loadavg_at_end'][0]:.2f}", ""]

    base16 = None
    if "baseline" in res:
        b = res["baseline"]
        lines += ["### Baseline: one-row INSERT transactions into the same PostgreSQL database", "",
                  "| client | clients | tx/s | p50 ms | p99 ms |", "| --- | ---: | ---: | ---: | ---: |"]
        if "error" in b:
            lines.append(f"| error | | {b['error']} | | |")
        for row in b.get("psycopg", []):
            lines.append(f"| psycopg 3, autocommit off | {row['clients']} | {fmt(row['tx_per_s'])} | "
                         f"{fmt(row['p50_ms'], 2)} | {fmt(row['p99_ms'], 2)} |")
            if row["clients"] == cfg["clients"]:
                base16 = row["tx_per_s"]
        pgb = b.get("pgbench")
        if pgb:
            lines.append(f"| pgbench (C, autocommit INSERT) | {pgb['clients']} | "
                         f"{fmt(pgb.get('tx_per_s')) if 'tx_per_s' in pgb else pgb.get('error', '?')[:80]} | – | – |")
        lines.append("")

    if "sends" in res:
        lines += [f"### Sends through the HTTP API ({cfg['clients']} aiohttp clients, {fmt(cfg['seconds'])} s "
                  f"measured after {fmt(cfg['warmup'])} s warm-up, PostgreSQL)", "",
                  "| server | sends/s | vs insert tx/s | p50 ms | p99 ms | errors | peak RSS per process, MiB "
                  "| CPU cores server / client / machine | tracebacks | ≥ 8% | ≤ 120 MiB |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | --- |"]
        for name, r in res["sends"].items():
            if "error" in r:
                lines.append(f"| {name} | failed: {r['error'][:120]} | | | | | | | | | |")
                continue
            rss = [p["peak_rss_mib"] for p in r["processes"]]
            rss_text = " / ".join(f"{p['role'][0]}:{p['peak_rss_mib']:.0f}" for p in r["processes"])
            share = f"{100 * r['sends_per_s'] / base16:.1f}%" if base16 else "–"
            lines.append(f"| {name} | {fmt(r['sends_per_s'])} | {share} | {fmt(r['p50_ms'], 1)} | "
                         f"{fmt(r['p99_ms'], 1)} | {r['errors']} | {rss_text} | "
                         f"{r['server_cpu_cores']:.2f} / {r['client_cpu_cores']:.2f} / {r.get('machine_cpu_cores', 0):.2f} | "
                         f"{r['server_log']['tracebacks']} | "
                         f"{verdict(bool(base16) and r['sends_per_s'] >= TARGET_SENDS_SHARE * base16)} | "
                         f"{verdict(max(rss, default=0) <= TARGET_RSS_MIB)} |")
        listening = [r["log_topic_subscribers"]["before"] for r in res["sends"].values()
                     if "log_topic_subscribers" in r]
        listening = [n for n in listening if n is not None]
        if listening:
            lines += ["", f"Processes subscribed to the Redis log topic (`{LOG_TOPIC_CHANNEL}`) before each setup: "
                      + ", ".join(map(str, listening)) + " (each hears every commit's nudge)."]
        lines += ["", "RSS: m = main process (the only one for Daphne), w = worker, h = helper (multiprocessing resource tracker); "
                  "peak of VmRSS sampled every 0.1 s. CPU cores: CPU time used during warm-up + measurement / wall time "
                  "(server: all its processes; client: this process; machine: every process, PostgreSQL and Redis included).", ""]

    if "feeds" in res:
        f = res["feeds"]
        if "error" in f:
            lines += [f"### Feed pages: failed: {f['error']}", ""]
        else:
            s1k, s1m = f["stages"]["1k"], f["stages"]["1M"]
            lines += [f"### Feed pages (limit {f['page']}, {cfg['feed_requests']} sequential requests each, "
                      f"cursor in the middle, {f['server']})", "",
                      f"Log: {fmt(s1k['events_in_log'])} events (1k stage) vs {fmt(s1m['events_in_log'])} (1M stage).",
                      "",
                      "| feed | 1k p50 ms | 1k p99 ms | 1M p50 ms | 1M p99 ms | ratio p50 | ratio p99 | errors "
                      "| ≤ 1.3 |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
            rows = (("space feed, 1k-event space (`feed-small`)", "small", "small", "space_small"),
                    ("space feed, ~1M-event space (`feed-big`) vs 1k space", "small", "big", "space_big"),
                    ("inbox feed (`/v0/me/inbox/events`)", "inbox", "inbox", "inbox"))
            for label, k1, k2, key in rows:
                a, b = s1k[k1], s1m[k2]
                ratio = f["ratios"][f"{key}_p50_ms"]
                errors = a["errors"] + b["errors"] + a["short_pages"] + b["short_pages"]
                lines.append(f"| {label} | {fmt(a['p50_ms'], 2)} | {fmt(a['p99_ms'], 2)} | {fmt(b['p50_ms'], 2)} | "
                             f"{fmt(b['p99_ms'], 2)} | {fmt(ratio, 2)} | {fmt(f['ratios'][f'{key}_p99_ms'], 2)} | "
                             f"{errors} | {verdict(None if ratio is None else ratio <= TARGET_FEED_RATIO)} |")
            lines.append("")

    if "inbox" in res:
        lines += inbox_markdown(res["inbox"], cfg, base16)

    if "webhooks" in res:
        lines += webhooks_markdown(res["webhooks"], cfg)

    if "live" in res:
        lines += live_markdown(res["live"])
    if "mentions" in res:
        lines += mentions_markdown(res["mentions"])
    if "statements" in res:
        lines += statements_markdown(res["statements"])
    if "mcp" in res:
        lines += mcp_markdown(res["mcp"])
    if "tasks" in res:
        lines += tasks_markdown(res["tasks"])

    if "growth" in res:
        lines += growth_markdown(res["growth"])

    if "peer" in res:
        lines += peer_markdown(res["peer"], res.get("sends", {}).get("serve"))

    problems = []
    servers = [(f"sends, {name}", r) for name, r in res.get("sends", {}).items()]
    for phase in ("feeds", "inbox"):
        if "server_log" in res.get(phase, {}):
            servers.append((f"{phase}, {res[phase]['server']}", res[phase]))
    for label, r in servers:
        log = r.get("server_log", {})
        if r.get("errors"):
            problems.append(f"- {label}: {r['errors']} failed sends {r.get('statuses', {})}")
        for line, count in list(log.get("exceptions", {}).items())[:4]:
            problems.append(f"- {label}: traceback ending `{line[:160]}` ×{count} ({log['stderr']})")
        for line, count in sorted(log.get("log_lines", {}).items(), key=lambda kv: -kv[1])[:4]:
            problems.append(f"- {label}: log line `{line[:160]}` ×{count}")
    ack = res.get("inbox", {}).get("ack", {})
    if ack.get("errors"):
        problems.append(f"- inbox: {ack['errors']} failed acknowledgements {ack.get('statuses', {})}")
    if ack and not ack["check"]["ok"]:
        problems.append(f"- inbox: after the acknowledgements {ack['check']} (200s: {ack['acks_total']})")
    for name, r in res.get("live", {}).get("setups", {}).items():
        if "error" in r:
            problems.append(f"- live, {name} failed: {r['error']}")
        elif r.get("errors") or r.get("timeouts"):
            problems.append(f"- live, {name}: {r['missing']} missing, {r['duplicates']} duplicate, "
                            f"{r['unknown_frames']} unknown frames, {r['timeouts']} sends not seen by every client, "
                            f"{len(r['early_closes'])} sockets closed early {r['early_closes'][:3]}")
        for log in r.get("server_logs", []):
            for line, count in list(log.get("exceptions", {}).items())[:4]:
                problems.append(f"- live, {name}: traceback ending `{line[:160]}` ×{count} ({log['stderr']})")
    for name, r in res.get("mcp", {}).items():
        if isinstance(r, dict) and "error" in r:
            problems.append(f"- mcp, {name} failed: {r['error']}")
    stream = res.get("mcp", {}).get("stream", {})
    for label, r in (("stream", stream.get("stream", {})), ("WebSocket baseline", stream.get("websocket", {}))):
        if r.get("errors") or r.get("timeouts"):
            problems.append(f"- mcp, {label}: {r['missing']} missing, {r['duplicates']} duplicate, "
                            f"{r.get('unknown_events', r.get('unknown_frames'))} unknown, {r['timeouts']} timeouts")
    for line, count in list(stream.get("server_log", {}).get("exceptions", {}).items())[:4]:
        problems.append(f"- mcp, stream: traceback ending `{line[:160]}` ×{count} ({stream['server_log']['stderr']})")
    push = res.get("mcp", {}).get("push", {}).get("push", {})
    if push and (push["unique"] < push["items"] or push["duplicates"] or push["pending_left"]):
        problems.append(f"- mcp, push: {push['unique']} of {push['items']} items received, {push['duplicates']} "
                        f"duplicates, {push['pending_left']} still pending")
    for phase in ("baseline", "feeds", "inbox", "live", "mcp"):
        if "error" in res.get(phase, {}):
            problems.append(f"- {phase} failed: {res[phase]['error']}")
    if problems:
        lines += ["### Problems seen (server stderr and failed requests)", "", *problems, ""]
    lines.append(f"Results: {report['results_file']}")
    return "\n".join(lines)


def inbox_markdown(r: dict, cfg: dict, base16: float | None) -> list[str]:
    if "error" in r:
        return [f"### Inbox: failed: {r['error']}", ""]
    st, ratios = r["stages"], r["ratios"]
    lines = [f"### Inbox pages (`GET /v0/me/inbox`, at most {r['page_items']} items, {cfg['feed_requests']} "
             f"sequential requests each, {r['server']})", "",
             "Pending items of the member read: " + " / ".join(fmt(s["items"]) for s in st.values())
             + f" (items table: {fmt(st['1M']['items_in_table'])} rows, {fmt(st['1M']['table_mib'])} MiB at the "
             f"last stage; that stage loaded in {fmt(st['1M']['load_seconds'])} s).", "",
             "| request | 10 p50 / p99 ms | 10k p50 / p99 ms | 1M p50 / p99 ms | ratio 10k / 10 p50 "
             "| ratio 1M / 10 p50 / p99 | ratio 1M / 10k p50 | errors | ≤ 1.3 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    rows = (("first page (no cursor)", "first"), ("next page (`nextCursor` of the first)", "next"),
            ("middle page (cursor at the middle item)", "middle"), ("event lookup (`/v0/inbox-events/evt_…`)", "event"),
            ("held page (`/v0/me/inbox/held`, none held)", "held"))
    for label, page in rows:
        if f"{page}_1M/10_p50_ms" not in ratios:
            continue  # a run from before this row
        cells = [st[s].get(page) for s in ("10", "10k", "1M")]
        errors = sum(c["errors"] + c.get("wrong_pages", 0) for c in cells if c)
        ratio = ratios[f"{page}_1M/10_p50_ms"]
        lines.append(f"| {label} | " + " | ".join(f"{fmt(c['p50_ms'], 2)} / {fmt(c['p99_ms'], 2)}" if c else "–"
                                                 for c in cells)
                     + f" | {fmt(ratios[f'{page}_10k/10_p50_ms'], 2)} | {fmt(ratio, 2)} / "
                     f"{fmt(ratios[f'{page}_1M/10_p99_ms'], 2)} | {fmt(ratios[f'{page}_1M/10k_p50_ms'], 2)} | "
                     f"{errors} | {verdict(None if ratio is None else ratio <= TARGET_FEED_RATIO)} |")
    a = r["ack"]
    if base16 is None and "insert_baseline" in r:
        base16 = r["insert_baseline"]["tx_per_s"]
    share = f"{100 * a['acks_per_s'] / base16:.1f}%" if base16 else "–"
    lines += ["", "Ratios are against the 10-item first page (event lookups and held pages: the 10-item stage's "
              "own), which holds 10 items where the others hold 50; 1M / 10k compares the same page.", "",
              f"### Acknowledgements (`POST /v0/me/inbox/acknowledge`, {a['clients']} aiohttp clients, one member "
              f"and distinct tokens each, {fmt(a['seconds'])} s after {fmt(a['warmup_seconds'])} s warm-up, "
              f"{r['server']})", "",
              "| acks/s | vs insert tx/s | insert tx/s | p50 ms | p99 ms | errors | rows and mailboxes agree |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
              f"| {fmt(a['acks_per_s'])} | {share} | {fmt(base16)} | {fmt(a['p50_ms'], 1)} | {fmt(a['p99_ms'], 1)} "
              f"| {a['errors']} | {verdict(a['check']['ok'])} |", ""]
    return lines


LIVE_SETUPS = {"1proc": "1 process (`serve --no-worker`)", "2proc": "2 processes, clients split, sends to the first",
               "1proc-1client": "1 process, 1 client (no fan-out)"}


def tasks_markdown(r: dict) -> list[str]:
    lines = ["### Claim sweeps: one scan (100 check-ins) over 1,000 and 100,000 claimed tasks (in-process)", "",
             "| claimed tasks | scan ms median (min–max) | check-ins per scan | load s |", "| ---: | ---: | --- | ---: |"]
    if "error" in r:
        return lines + [f"| failed: {r['error'][:120]} | | | |", ""]
    for size, row in r["sizes"].items():
        lines.append(f"| {int(size):,} | {fmt(row['scan_ms_median'])} ({fmt(row['scan_ms_min'])}–"
                     f"{fmt(row['scan_ms_max'])}) | {row['checkins_per_scan']} | {fmt(row['load_seconds'])} |")
    ratio = r["ratio_100k_to_1k"]
    return lines + ["", f"Ratio 100,000 : 1,000 = {fmt(ratio, 2)} (target ≤ {r['target']}: "
                        f"{verdict(ratio <= r['target'])}).", ""]


def mentions_markdown(r: dict) -> list[str]:
    lines = ["### Mention parsing, worst shapes of an 8 KiB body (in-process)", "",
             "| body | ms at 8 KiB | × ordinary prose | growth 2 → 8 KiB (4.0 = linear) |",
             "| --- | ---: | ---: | ---: |"]
    if "error" in r:
        return lines + [f"| failed: {r['error'][:120]} | | | |", ""]
    for name, row in r["shapes"].items():
        lines.append(f"| {name} | {fmt(row['ms_8k'], 2)} | {fmt(row['vs_prose'])} | {fmt(row['growth_2k_to_8k'], 2)} |")
    return lines + [""]


def statements_markdown(r: dict) -> list[str]:
    lines = [f"### Prepared statements (threshold {r.get('threshold')}) against client-side binding, CPU per "
             "operation (in-process, alternating blocks on one connection)", "",
             "| operation | client-side binding: Python / PostgreSQL / total µs "
             "| prepared: Python / PostgreSQL / total µs | prepared ÷ client-side |",
             "| --- | ---: | ---: | ---: |"]
    if "error" in r:
        return lines + [f"| failed: {r['error'][:120]} | | | |", ""]
    for name, row in r["operations"].items():
        cells = [f"{row[way]['python_us']:,} / {row[way]['postgres_us']:,} / {row[way]['total_us']:,}"
                 for way in ("client_binding", "prepared")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {fmt(row['ratio'], 2)} |")
    return lines + [""]


def live_markdown(r: dict) -> list[str]:
    if "error" in r:
        return [f"### Live pages: failed: {r['error']}", ""]
    layer = r["layer_round_trip"]
    lines = [f"### Live pages: send → WebSocket frame ({r['clients']} clients on one conversation, {r['sends']} "
             f"sends one at a time, {r['gap_ms']} ms after the previous send's last frame)", "",
             "| setup | frame p50 / p99 / max ms | first / last client p50 ms | last client p99 ms "
             "| send response p50 / p99 ms | ratio p50 / p99 to send | ratio p50 / p99 to layer "
             "| frames (missing, dup.) | long-poll response p50 / p99 ms (missing) | server peak RSS MiB | CPU cores "
             "| ≤ 17 / 37 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for name, s in r["setups"].items():
        label = LIVE_SETUPS.get(name, name)
        if "error" in s:
            lines.append(f"| {label} | failed: {s['error'][:120]} | | | | | | | | | | |")
            continue
        f, first, last, post, ratios = s["frame"], s["first_client"], s["last_client"], s["send_response"], s["ratios"]
        ok = (f["p50_ms"] is not None and f["p50_ms"] <= TARGET_FRAME_P50_MS and f["p99_ms"] <= TARGET_FRAME_P99_MS
              and not s["errors"] and not s["timeouts"])
        cells = [f"{fmt(f['p50_ms'])} / {fmt(f['p99_ms'])} / {fmt(f['max_ms'])}",
                 f"{fmt(first['p50_ms'])} / {fmt(last['p50_ms'])}", fmt(last["p99_ms"]),
                 f"{fmt(post['p50_ms'])} / {fmt(post['p99_ms'])}",
                 f"{fmt(ratios.get('p50_to_send'))} / {fmt(ratios.get('p99_to_send'))}",
                 f"{fmt(ratios.get('p50_to_layer'))} / {fmt(ratios.get('p99_to_layer'))}",
                 f"{s['frames']:,} of {s['expected_frames']:,} ({s['missing']}, {s['duplicates']})",
                 f"{fmt(s['long_poll']['p50_ms'])} / {fmt(s['long_poll']['p99_ms'])} ({s['long_poll_missing']})",
                 fmt(s["server_peak_rss_mib"], 0), f"{s['server_cpu_cores']:.2f}", verdict(ok)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    split = r["setups"].get("2proc", {}).get("frame_by_server")
    if split:
        where = {"same": "sending process", "other": "other process (through Redis)"}
        lines += ["", "Two processes, by where the client's socket is: " + "; ".join(
            f"{where[k]} p50 {fmt(v['p50_ms'])} / p99 {fmt(v['p99_ms'])} ms" for k, v in split.items()) + "."]
    lines += ["", f"Baseline, raw channel-layer round trip ({layer['layer']}: group_send to a group, receive on its "
              f"channel in another task of the bench process, {layer['count']} rounds): p50 "
              f"{fmt(layer['p50_ms'], 2)} ms, p99 {fmt(layer['p99_ms'], 2)} ms. Send response: t0 → HTTP response "
              "of the same sends.", ""]
    return lines


def growth_markdown(g: dict) -> list[str]:
    if "error" in g:
        return [f"### Cost growth: failed: {g['error']}", ""]
    stages = list(g)
    clients = list(g[stages[0]]["sends"])
    lines = ["### Cost growth: sends/s through `serve` by clients and log size", "",
             "| clients | " + " | ".join(f"{s} log ({fmt(g[s]['events_in_log'])} events): sends/s, p50 / p99 ms"
                                      for s in stages) + " | ratio " + " / ".join(stages) + " |",
             "| ---: | " + " | ".join("---" for _ in stages) + " | ---: |"]
    for c in clients:
        rows = [g[s]["sends"][c] for s in stages]
        cells = [f"{fmt(r['sends_per_s'])}, {fmt(r['p50_ms'], 1)} / {fmt(r['p99_ms'], 1)}"
                 + (f" ({r['errors']} errors)" if r["errors"] else "") for r in rows]
        ratio = rows[0]["sends_per_s"] / rows[-1]["sends_per_s"] if rows[-1]["sends_per_s"] else None
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {fmt(ratio, 2) if ratio else '–'} |")
    return lines + [""]


def peer_markdown(p: dict, serve: dict | None) -> list[str]:
    """matrix-synapse beside `serve`, same client and concurrency (bench/peer.py)."""
    if "error" in p or "sends" not in p:
        return [f"### Peer (matrix-synapse): failed: {p.get('error', '?')}", ""]
    s = p["sends"]
    lines = [f"### Peer: matrix-synapse {p['version']} beside `serve` ({s['clients']} clients, same client)", "",
             "| server | sends/s | p50 / p99 ms | errors | peak RSS MiB |", "| --- | ---: | ---: | ---: | ---: |",
             f"| matrix-synapse (one process, PostgreSQL) | {fmt(s['sends_per_s'])} | {fmt(s['p50_ms'])} / "
             f"{fmt(s['p99_ms'])} | {s['errors']} | {fmt(p.get('peak_rss_mib'), 0)} |"]
    if serve and "error" not in serve:
        lines.append(f"| `serve` | {fmt(serve['sends_per_s'])} | {fmt(serve['p50_ms'])} / {fmt(serve['p99_ms'])} | "
                     f"{serve['errors']} | {max(q['peak_rss_mib'] for q in serve['processes']):.0f} |")
        if s["sends_per_s"]:
            lines += ["", f"`serve` / synapse: **{serve['sends_per_s'] / s['sends_per_s']:.1f}×** (goal 10×)."]
    return lines + [""]
