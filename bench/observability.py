"""What metrics and tracing cost: the same turns through services started three ways, side by side.

Used by `bench.pipeline_overhead --observability` and `bench.gateway_relay --observability`. The three set-ups
run at once and the turns are interleaved between them, so a loaded machine's drift hits all three alike; the
figure is the CPU time (user + system, every process of the server's process group) per turn, not wall time.

    off              METRICS=off, no OTLP endpoint: the baseline
    metrics          the default: Prometheus metrics recorded, tracing off
    metrics+tracing  metrics, and every span exported over OTLP/HTTP to a local receiver
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIGS = ("off", "metrics", "metrics+tracing")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def config_env(name: str, otlp_url: str) -> dict[str, str]:
    if name == "off":
        return {"METRICS": "off"}
    if name == "metrics":
        return {}
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url, "OTEL_BSP_SCHEDULE_DELAY": "1000"}


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in process group `pgid` (a server and its helpers)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        # After the command: state ppid pgrp session ... utime (14th field overall) stime (15th).
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def table(rows: dict[str, dict], unit_key: str, label: str) -> str:
    """Side by side: CPU ms per turn and its change against the baseline."""
    base = rows["off"][unit_key]
    lines = [f"{'set-up':18} {label:>18} {'vs off':>8}"]
    for name in CONFIGS:
        value = rows[name][unit_key]
        change = (value - base) / base * 100 if base else float("nan")
        lines.append(f"{name:18} {value:>15.1f} ms {change:>+7.1f}%")
    return "\n".join(lines)
