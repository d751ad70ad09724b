"""`aurelius report OUT` (and `aurelius replay --report`): the HTML report and figures of a replay output."""

from __future__ import annotations

import argparse
import sys

from streams.report.page import build


def run(args: argparse.Namespace) -> int:
    try:
        page = build(args.out_dir, args.dest, png=not args.no_figures)
    except FileNotFoundError as exc:
        print(f"aurelius report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {page}" + ("" if args.no_figures else f" and figures under {page.parent / 'figures'}"))
    return 0
