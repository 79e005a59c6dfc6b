#!/usr/bin/env python
"""What one poll of the memory inspector's overview costs the server: CPU time of gpuir.memory.overview.

The page polls ``GET /v1/tenants/{tenant}/overview`` once a second (a second after each answer); this times
the work behind one poll on a tenant's search memory of N records (sessions, times, several segments), as CPU
seconds of this process (``time.process_time``, so other jobs on a shared machine do not count), and writes
the share of one core that one open page costs at one poll a second.

    python bench/bench_overview.py [--sizes 12 1000 100000] [--out bench/results/overview_vm.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuir import Memory
from gpuir.memory.overview import overview


def build(n: int) -> Memory:
    m = Memory(partition_days=7)
    step = max(1, n // 8)  # several adds: several segments
    for s in range(0, n, step):
        m.add([{"id": f"r{i}", "text": f"note {i} about topic {i % 50}", "session": f"s{i % 200}",
                "time": 1_680_000_000_000 + i * 60_000} for i in range(s, min(n, s + step))], time_unit="ms")
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[12, 1000, 100_000])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = []
    for n in a.sizes:
        m = build(n)
        overview(m)  # warm
        cpu = []
        for _ in range(a.repeat):
            t = time.process_time()
            overview(m)
            cpu.append(time.process_time() - t)
        cpu.sort()
        med = cpu[len(cpu) // 2]
        rows.append({"records": n, "segments": len(overview(m)["segments"]), "cpu_ms_median": med * 1e3,
                     "cpu_ms_p90": cpu[int(len(cpu) * 0.9)] * 1e3, "share_of_one_core_at_1_poll_per_s": med})
        print(json.dumps(rows[-1]))
    if a.out:
        a.out.write_text(json.dumps({"rows": rows, "command": "python bench/bench_overview.py " +
                                     " ".join(argv if argv is not None else sys.argv[1:])}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
