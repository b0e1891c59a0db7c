"""Output of a benchmark run: the printed table, the JSON files and the PNG chart."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT

RESULTS = ROOT / "bench" / "results"


def _lat(summary: dict[str, Any]) -> str:
    if not summary.get("count"):
        return "-"
    return f"p50 {summary['p50']} / p95 {summary['p95']} / p99 {summary['p99']} ms"


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows."""
    m = result["machine"]
    out: list[tuple[str, str, str]] = [
        ("machine", f"{m['nproc']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM", ""),
        ("load average (start / end)", f"{m['loadavg_start']} / {m.get('loadavg_end')}", ""),
        ("machine used outside the run",
         f"{m['other_work_share']:.1%}" if m.get("other_work_share") is not None else "-",
         "<= 10 %"),
        ("settings", "max_concurrent_activities {max_concurrent_activities}, "
                     "max_concurrent_workflow_tasks {max_concurrent_workflow_tasks}, worker "
                     "processes per side {workers}, posts in flight {post_concurrency}, "
                     "ingress clients {concurrency}".format(**result["options"]), ""),
    ]
    tp = result.get("throughput")
    if tp:
        for run in tp["runs"]:
            label = f"{run['kind']} r{run['round'] + 1}"
            if run.get("error"):
                out.append((f"throughput {label}", f"ERROR: {run['error']}; answers so far "
                            f"{run.get('answers')}", ""))
                continue
            if run["kind"].startswith("floor"):
                detail = (f"{run['per_second']} wf/s ({run['workflows']} in "
                          f"{run['elapsed_seconds']} s; {run['statuses']})")
            else:
                detail = (f"{run['per_second']} emails/s ({run['settled']}/{run['emails']} "
                          f"settled in {run['elapsed_seconds']} s; {run['posts']} posts; "
                          f"states {run['states']}; answers {run['answers']})")
            out.append((f"throughput {label}", detail, ""))
            out.append((f"latency {label}", _lat(run["latency_ms"]), ""))
            cpu = run.get("cpu_seconds")
            if cpu:
                busy = {k: v for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05}
                out.append((f"CPU s {label}", f"{round(sum(cpu.values()), 1)} s total: "
                            + ", ".join(f"{k} {v}" for k, v in busy.items()), ""))
            steps = run.get("steps_per_item")
            if steps:
                out.append((f"steps per item {label}", f"{steps['activities']} activities + "
                            f"{steps['local_activities']} local, {steps['history_events']} "
                            "history events (one run's history)", ""))
        shape = tp.get("floor_shape") or {}
        out.append(("throughput product / floor",
                    f"{tp['ratio']} ({tp['product_per_second']} / {tp['floor_per_second']} "
                    f"per s; floor: {shape.get('activities')} activities + "
                    f"{shape.get('local_activities')} local)", f">= {tp['target_ratio']}"))
        rounds = tp.get("ratio_by_round") or []
        if len(rounds) > 1:
            out.append(("product / floor by round", ", ".join(
                f"r{r['round']} {r['ratio']} ({r['first']} first)" for r in rounds), ""))
        same = tp.get("same_shape_floor")
        if same:
            out.append(("product / floor in the product's shape",
                        f"{same['ratio']} ({tp['product_per_second']} / {same['per_second']} "
                        f"per s; {same['activities']} activities + {same['local_activities']} "
                        "local, no-op): the cost of the real work", ""))
        speed = tp.get("machine_speed") or {}
        if speed.get("probes"):
            out.append(("machine speed over the runs (fixed loop, CPU ms)",
                        f"{speed['min_ms']} to {speed['max_ms']} ms over {speed['probes']} "
                        f"probes: spread {speed['spread']:.0%}", "<= 10 %"))
        out += cpu_rows(tp.get("cpu_per_item"))
        out += same_work_rows(tp.get("same_work_floor"))
        out += profile_rows(tp.get("profiled_run"))
    pk = result.get("parked")
    if pk and pk.get("error"):
        out.append(("parked work", f"ERROR: {pk['error']}", ""))
    elif pk:
        out.append(("parked in review", f"{pk['parked_waiting']}/{pk['parked_requested']} "
                    f"(all waiting after {pk['seconds_to_park_all']} s)", ""))
        out.append(("worker RSS idle -> parked",
                    f"{pk['rss_mb_before'].get('worker')} -> {pk['worker_rss_mb']} MB",
                    f"<= {pk['target_worker_rss_mb']} MB"))
        out.append(("Temporal server RSS idle -> parked",
                    f"{pk['rss_mb_before'].get('temporal')} -> {pk['temporal_rss_mb']} MB", ""))
        q = pk["queue_cli"]
        out.append(("inboxcrm queue --json",
                    q.get("error") or f"{q['listed']} items, median {q['wall_seconds_median']} s"
                    f" (min {q['wall_seconds_min']}, max {q['wall_seconds_max']})", ""))
    ing = result.get("ingress")
    if ing:
        for case in ing["cases"]:
            if case.get("error"):
                out.append((f"ingress {case['case']} ({case.get('clients')} clients)",
                            f"ERROR: {case['error']}", ""))
                continue
            out.append((f"ingress {case['case']} ({case.get('clients')} clients)",
                        f"{case['requests_per_second']} req/s, "
                        f"p50 {case['latency_ms'].get('p50')} / p99 "
                        f"{case['latency_ms'].get('p99')} ms; {case['answers']}; CPU ms/request"
                        f" server {case.get('server_cpu_ms_per_request')}, client "
                        f"{case.get('client_cpu_ms_per_request')}", ""))
        out.append(("ingress duplicate / bare",
                    f"p50 x{ing['duplicate_vs_bare_p50']}, p99 x{ing['duplicate_vs_bare_p99']}"
                    f"; bare serves x{ing['duplicate_vs_bare_rps']} the req/s; server CPU "
                    f"per request x{ing.get('duplicate_vs_bare_server_cpu')}",
                    f"<= x{ing['target_duplicate_vs_bare']}"))
    budget = result.get("budget")
    if budget and budget.get("error"):
        out.append(("budget", f"ERROR: {budget['error']}", ""))
    elif budget:
        from bench import extraction_budget

        out += extraction_budget.rows(budget)
    for note in result.get("notes", []):
        out.append(("note", note, ""))
    return out


def cpu_rows(cpu: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """CPU ms per item by role (median over rounds) and the ratios of the sums."""
    if not cpu:
        return []
    out: list[tuple[str, str, str]] = []
    for kind in ("product", "samework", "floor-same-shape", "floor"):
        roles = cpu.get(kind)
        if not roles:
            continue
        busy = sorted(((k, v) for k, v in roles.items() if k != "total" and v >= 0.5),
                      key=lambda kv: -kv[1])
        out.append((f"CPU ms per item, {kind}", f"{roles['total']} total: "
                    + ", ".join(f"{k} {v}" for k, v in busy), ""))
    if cpu.get("ratio_vs_same_shape") is not None:
        rounds = ", ".join(f"r{r['round']} {r.get('vs_same_shape')}"
                           for r in cpu.get("ratio_by_round", []))
        out.append(("CPU per item, product / floor in the product's shape",
                    f"{cpu['ratio_vs_same_shape']} (by round: {rounds})",
                    f"<= {cpu['target_ratio_vs_same_shape']}"))
    if cpu.get("ratio_vs_plain_floor") is not None:
        out.append(("CPU per item, product / plain floor", str(cpu["ratio_vs_plain_floor"]),
                    ""))
    if cpu.get("product_without_stand_in") is not None:
        out.append(("CPU ms per item, product without the stand-in (sandbox + its PostgreSQL)",
                    f"{cpu['product_without_stand_in']}: / floor in the product's shape "
                    f"{cpu.get('own_ratio_vs_same_shape')}, / plain floor "
                    f"{cpu.get('own_ratio_vs_plain_floor')}", ""))
    return out


def same_work_rows(same: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The product against the same-work floor (bench/samework.py): the two ratios of the
    issue-38 target and the extra CPU by process."""
    if not same:
        return []
    cpu, rates = same["cpu_ms_per_email"], same["per_second"]
    extra = ", ".join(f"{k} {v:+}" for k, v in same["extra_cpu_ms_by_process"].items())
    return [
        ("CPU per email, product / same-work floor",
         f"{same['cpu_ratio']} ({cpu['product']} / {cpu['samework']} ms, every process)",
         f"<= {same['target_cpu_ratio']}"),
        ("emails/s, product / same-work floor",
         f"{same['throughput_ratio']} ({rates['product']} / {rates['samework']} per s)",
         f">= {same['target_throughput_ratio']}"),
        ("product's extra CPU ms per email by process (vs same-work floor)", extra, ""),
        ("history events per item (product, same-work floor)",
         f"{same['history_events_per_item'].get('product')}, "
         f"{same['history_events_per_item'].get('samework')}"
         + ("; differ: " + ", ".join(f"{k} {v['product']}/{v['samework']}"
                                     for k, v in same.get("history_event_types", {}).items())
            if same.get("history_event_types") else ""), ""),
    ]


def profile_rows(prof: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The profiled run: counts per item and the top of each process's profile."""
    if not prof:
        return []
    run = prof.get("run") or {}
    if run.get("error"):
        return [("profiled run", f"ERROR: {run['error']}", "")]
    out: list[tuple[str, str, str]] = [
        ("profiled run (not counted)", f"{run.get('settled')} emails, {run.get('per_second')}"
         f"/s with py-spy attached; states {run.get('states')}", "")]
    hist = prof.get("history") or {}
    if hist.get("items"):
        kinds = ", ".join(f"{k.lower()} {v}" for k, v in hist["by_type_per_item"].items())
        out.append(("history events per item", f"{hist['events_per_item']} "
                    f"({hist['history_bytes_per_item']} bytes): {kinds}", ""))
        happy = (hist.get("by_outcome") or {}).get("completed/followup_sent")
        if happy:
            out.append(("history events, happy item", f"{happy['events_per_item']} "
                        f"({happy['history_bytes_per_item']} bytes): " + ", ".join(
                            f"{k.lower()} {v}" for k, v in happy["by_type_per_item"].items()),
                        ""))
    for side, entry in (prof.get("postgres") or {}).items():
        out.append((f"PostgreSQL per item, {side}",
                    f"{entry['round_trips_per_item']} round trips ({entry['statements_per_item']}"
                    f" statements + {entry['transaction_control_per_item']} transaction "
                    f"control), {entry['exec_ms_per_item']} ms executing", ""))
    if prof.get("storage_bytes_per_item"):
        out.append(("storage per item", ", ".join(
            f"{k} {v}" for k, v in prof["storage_bytes_per_item"].items()), ""))
    if prof.get("destination_calls_per_item"):
        out.append(("destination calls per item", ", ".join(
            f"{k} {v}" for k, v in prof["destination_calls_per_item"].items()), ""))
    if prof.get("codec_bytes_per_item"):
        out.append(("codec bytes per item (workers)", ", ".join(
            f"{k} {v}" for k, v in prof["codec_bytes_per_item"].items()), ""))
    for name, summary in (prof.get("profiles") or {}).items():
        if not isinstance(summary, dict) or "self_by_package" not in summary:
            out.append((f"profile {name}", f"ERROR: {summary}", ""))
            continue
        top = ", ".join(f"{r['frame']} {r['ms_per_item']}"
                        for r in summary["self_by_package"][:8])
        out.append((f"profile {name} (sampled ms/item, self by package)",
                    f"{summary['sampled_ms_per_item']} sampled: {top}; "
                    f"{summary.get('flamegraph')}", ""))
    return out


def format_table(table: list[tuple[str, str, str]]) -> str:
    w1 = max(len(r[0]) for r in table)
    w3 = max(max(len(r[2]) for r in table), len("target"))
    lines = [f"{'figure'.ljust(w1)} | {'target'.ljust(w3)} | value",
             f"{'-' * w1}-+-{'-' * w3}-+-{'-' * 50}"]
    lines += [f"{a.ljust(w1)} | {c.ljust(w3)} | {b}" for a, b, c in table]
    return "\n".join(lines)


def write_json(result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(result["started_at"]))
    text = json.dumps(result, indent=2, sort_keys=False, default=str) + "\n"
    path = RESULTS / f"{stamp}.json"
    path.write_text(text)
    (RESULTS / "latest.json").write_text(text)
    return path


def write_chart(result: dict[str, Any]) -> Path | None:
    """bench/results/latest.png (matplotlib, Agg). None when matplotlib is not installed
    (`pip install -e '.[bench]'`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [k for k in ("throughput", "ingress", "parked") if result.get(k)
              and not (k == "parked" and "rss_mb_parked" not in result[k])]
    if not panels:
        return None
    slots = []
    for p in panels:
        slots += [p] * (2 if p == "throughput" else 1)
    fig, axes = plt.subplots(1, len(slots), figsize=(4.2 * len(slots), 4.4))
    axes = list(axes) if len(slots) > 1 else [axes]
    ax_iter = iter(axes)
    colors = {"floor": "#7f7f7f", "floor-same-shape": "#c7c7c7", "samework": "#9edae5",
              "product": "#1f77b4"}
    tp = result.get("throughput")
    if tp:
        runs = tp["runs"]
        short = {"floor": "floor", "floor-same-shape": "own\nshape", "samework": "same\nwork",
                 "product": "prod"}
        labels = [f"{short.get(r['kind'], r['kind'])}\nr{r['round'] + 1}" for r in runs]
        ax = next(ax_iter)
        bars = ax.bar(labels, [r.get("per_second") or 0 for r in runs],
                      color=[colors.get(r["kind"], "#bcbd22") for r in runs])
        ax.bar_label(bars, fmt="%.1f")
        ax.set_title(f"end-to-end throughput (n={result['options']['n']})\n"
                     f"product/floor = {tp['ratio']}")
        ax.set_ylabel("items completed per second")
        ax.tick_params(axis="x", labelsize=7)
        ax = next(ax_iter)
        qs = ("p50", "p95", "p99")
        step = 0.8 / len(qs)
        for k, q in enumerate(qs):
            xs = [i + (k - 1) * step for i in range(len(runs))]
            ax.bar(xs, [r["latency_ms"].get(q, 0) / 1000 for r in runs], step, label=q,
                   alpha=0.5 + 0.25 * k, color="#1f77b4" if k else "#aec7e8")
        ax.set_xticks(range(len(runs)), labels)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title("latency per item\n(product: received -> completed; floor: start -> close)",
                     fontsize=10)
        ax.set_ylabel("seconds")
        ax.legend()
    ing = result.get("ingress")
    if ing:
        ax = next(ax_iter)
        cases = ing["cases"]
        names = [c["case"].replace("relay/", "relay\n").replace("@", "\n@") for c in cases]
        xs = range(len(cases))
        ax.bar([x - 0.2 for x in xs], [c["latency_ms"].get("p50", 0) for c in cases], 0.4,
               label="p50", color="#aec7e8")
        ax.bar([x + 0.2 for x in xs], [c["latency_ms"].get("p99", 0) for c in cases], 0.4,
               label="p99", color="#1f77b4")
        for x, c in zip(xs, cases, strict=True):
            if c.get("error"):
                ax.text(x, 0, "stalled", ha="center", va="bottom", color="red", rotation=90)
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("ms per request")
        ax.set_title(f"ingress at {ing['concurrency']} clients\n"
                     + ", ".join(f"{c['case'].split('/')[-1]} "
                                 f"{c.get('requests_per_second') or 0:.0f}/s"
                                 for c in cases), fontsize=9)
        ax.legend()
    pk = result.get("parked")
    if pk and "rss_mb_parked" in pk:
        ax = next(ax_iter)
        names = ["worker", "temporal"]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [pk["rss_mb_before"].get(n, 0) for n in names], 0.4,
               label="idle", color="#c7c7c7")
        ax.bar([x + 0.2 for x in xs], [pk["rss_mb_parked"].get(n, 0) for n in names], 0.4,
               label=f"{pk['parked_waiting']} parked", color="#ff7f0e")
        ax.axhline(pk["target_worker_rss_mb"], color="red", linestyle="--", linewidth=1,
                   label="worker target")
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("RSS MB")
        q = pk["queue_cli"]
        ax.set_title(f"parked work\nqueue --json {q.get('wall_seconds_median', '?')} s",
                     fontsize=10)
        ax.legend(fontsize=8)
    m = result["machine"]
    fig.suptitle(f"inboxcrm bench {result['label']} — {m['nproc']} cores, {m['cpu_model']}, "
                 f"load {m['loadavg_start'][0]} (preliminary if the machine was busy)",
                 fontsize=10)
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "latest.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
