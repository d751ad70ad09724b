"""Every difference between two results.json files, timings and the output path aside: the check that a change
leaves the replay's figures identical.

    python benchmarks/compare_results.py BEFORE/results.json AFTER/results.json [--across-rulers]

Results measured with different rulers (results.json `ruler.version`) are refused unless --across-rulers.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

#: Keys that measure the machine, not the fleet: wall time and decision latencies (ms).
TIMING = re.compile(r"^(wall_s|decision_(cpu_)?ms_\w+)$")


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, before, after) of every leaf that differs, timing keys skipped."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if TIMING.match(k) or path + "/" + k == "/config/out":
                continue
            if k not in a or k not in b:
                out.append((f"{path}/{k}", a.get(k, "<absent>"), b.get(k, "<absent>")))
            else:
                out.extend(differences(a[k], b[k], f"{path}/{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (u, v) in enumerate(zip(a, b, strict=True)) for d in differences(u, v, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


def ruler(results: dict[str, Any]) -> str:
    """The ruler version a results.json was measured with ("<none>" before rulers were recorded)."""
    return str(results.get("ruler", {}).get("version", "<none>"))


if __name__ == "__main__":
    with open(sys.argv[1]) as fa, open(sys.argv[2]) as fb:
        a, b = json.load(fa), json.load(fb)
    if ruler(a) != ruler(b) and "--across-rulers" not in sys.argv:
        print(f"different rulers: {ruler(a)} vs {ruler(b)}; figures not comparable (--across-rulers to diff anyway)")
        sys.exit(2)
    diffs = differences(a, b)
    for d in diffs:
        print(*d)
    print(f"{len(diffs)} differences (timings and the output path aside)")
