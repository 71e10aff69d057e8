"""`--logs [-f]`: the ends of logs/worker.log, logs/gateway.log and logs/demo-index.log, or follow them."""

from __future__ import annotations

import argparse
import sys
import time

from launcher.processes import tail


def cmd_logs(args: argparse.Namespace) -> int:
    names = ["worker", "gateway", "demo-index"] if args.logs == "all" else [args.logs]
    paths = [args.logs_dir / f"{n}.log" for n in names]
    existing = [p for p in paths if p.is_file()]
    if not existing:
        print(f"no logs yet in {args.logs_dir}/", file=sys.stderr)
        return 1
    for p in existing:
        print(f"==> {p} <==\n{tail(p, args.lines)}\n", flush=True)
    if not args.follow:
        return 0
    offsets = {p: p.stat().st_size for p in existing}
    try:
        while True:
            for p in paths:
                size = p.stat().st_size if p.is_file() else 0
                start = offsets.get(p, 0)
                if size < start:  # truncated or replaced
                    start = 0
                if size > start:
                    with open(p, "rb") as fh:
                        fh.seek(start)
                        chunk = fh.read(size - start).decode("utf-8", "replace")
                    prefix = f"[{p.stem}] "
                    sys.stdout.write("".join(prefix + line for line in chunk.splitlines(keepends=True)))
                    sys.stdout.flush()
                offsets[p] = size
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
