"""verify.py's JSON reports (--report) in a few lines each, many runs side by side.

    python scripts/verify_summary.py REPORT.json [...] [--sites TYPE,...] [--targets]

Per report: correctness, the types kept, the prune's mode and what it left out, each timing row in ms with its
speedups, the rows that could not be timed; with --sites, each site of those types that was not swapped or never
called, with the reason; with --targets, the end-to-end targets (#17) against the rows (optimized >= 1.3x eager,
optimized with compile >= 1.0x compile with and without graphs, optimized graphed >= 1.0x eager graphed), each
marked when the prune did not time its mode (a run with --deploy of the other side: a large model's two sides can
be verified in two runs, each within a GPU session's ten-minute call).
"""

import argparse
import json
import sys
from pathlib import Path

# (row, the row it is compared with, the least speedup, the deploy mode the row runs in)
TARGETS = (("optimized", "eager", 1.3, "eager"), ("optimized_compile", "compile", 1.0, "compile"),
           ("optimized_compile_graph", "compile", 1.0, "compile_graph"), ("optimized_graph", "eager", 1.0, "graph"))


def summary(report: dict, sites: set[str], targets: bool) -> list[str]:
    prune = report.get("prune") or {}
    lines = [f"correctness {report['correctness']['status']}, kept {','.join(report['swapped_types']) or 'none'}, "
             f"prune in {prune.get('mode', '-')} left out {','.join(report.get('pruned') or []) or 'none'}"]
    if prune.get("split"):
        lines[0] += (f"; under torch.compile kept {','.join(report['compiled_types']) or 'none'}, left out "
                     f"{','.join(prune['left_out_compiled']) or 'none'}")
    for row, t in report.get("timing", {}).items():
        speedups = "  ".join(f"{key[len('speedup_vs_'):]} {value:.2f}x" for key, value in t.items()
                             if key.startswith("speedup_vs_") and value is not None)
        lines.append(f"  {row:<24} {t['ms']:8.2f} ms  {speedups}")
    lines += [f"  not timed: {row}: {error}" for row, error in report.get("timing_errors", {}).items()]
    lines += [f"  site {s['where']}: swapped {s['swapped']}, calls {s['calls']}, {s['reason']}"
              for s in report.get("sites", []) if s["kernel_type"] in sites and not (s["swapped"] and s["calls"])]
    if targets:
        pruned_in = (prune.get("mode") or "").split(",")
        lines.append("  targets: " + "  ".join(_target(report.get("timing", {}), pruned_in, *t) for t in TARGETS))
    return lines


def _target(timing: dict, pruned_in: list[str], row: str, base: str, floor: float, mode: str) -> str:
    speedup = timing.get(row, {}).get(f"speedup_vs_{base}")
    if speedup is None:
        return f"{row} vs {base} n/a"
    unpruned = "" if mode in pruned_in else f", the prune did not time {mode}"
    return f"{row} vs {base} {speedup:.2f}x ({'met' if speedup >= floor else 'MISSED'} >= {floor}{unpruned})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="verify.py's JSON reports, a few lines each.")
    p.add_argument("reports", nargs="+", type=Path, help="verify.py --report files")
    p.add_argument("--sites", default="", help="comma-separated kernel types whose unswapped or uncalled sites to list")
    p.add_argument("--targets", action="store_true", help="issue 17's targets against the timing rows")
    args = p.parse_args(argv)
    unread = 0
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"{path}: not a readable report ({e})", file=sys.stderr)
            unread += 1
            continue
        print(f"{path.stem}: " + "\n".join(summary(report, set(filter(None, args.sites.split(","))), args.targets)))
    return 1 if unread else 0


if __name__ == "__main__":
    sys.exit(main())
