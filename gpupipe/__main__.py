"""``python -m gpupipe prepare SRC DST``, ``python -m gpupipe bench [...]`` and ``python -m gpupipe info``."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its options belong to gpupipe.bench
        from gpupipe.bench import main as bench_main

        return bench_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m gpupipe")
    from gpupipe import __version__

    ap.add_argument("--version", action="version", version=f"gpupipe {__version__} (distribution torch-gpupipe)")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="transcode a dataset (folder or tar shards) with restart markers, losslessly")
    # src takes one or more paths, dst the last: "prepare a.tar b.tar out"
    p.add_argument("src", nargs="+", help="a folder, a .tar shard, or several shards")
    p.add_argument("dst", help="the output folder (created)")
    p.add_argument("--restart-rows", type=int, default=1)
    p.add_argument("--restart-mcus", type=int, default=8, help="target MCUs per interval inside rows (0: rows only)")
    p.add_argument("--threads", type=int, default=None,
                   help="files transcoded in parallel (default, or 0: the default decode thread count)")
    p.add_argument("--no-verify", action="store_true")
    sub.add_parser("bench", help="images/s of a recipe on your data: the gpupipe Loader vs DataLoader "
                                 "(python -m gpupipe bench --help)")
    sub.add_parser("info", help="version, libjpeg-turbo, CUDA kernels, and which backends work here")
    args = ap.parse_args(argv)

    if args.command == "info":
        from gpupipe.bench.report import info

        print(info())
        return 0
    from gpupipe.prepare import prepare

    src = args.src[0] if len(args.src) == 1 else args.src
    dst = args.dst
    try:
        report = prepare(src, dst, restart_rows=args.restart_rows, restart_mcus=args.restart_mcus,
                         num_threads=args.threads, verify=not args.no_verify)
    except (OSError, ValueError) as e:  # a missing source, a destination that is the source
        message = str(e)
        print(f"python -m gpupipe prepare: {message.removeprefix('prepare: ')}", file=sys.stderr)
        return 2
    if report.files == 0 and not report.skipped_existing and not report.failed:
        print(f"python -m gpupipe prepare: no files to prepare in {', '.join(args.src)}", file=sys.stderr)
        return 1
    print(report)
    by_reason: dict = {}
    for path, reason in report.copied:  # (a shard's labels are each "not a JPEG": a count, a few examples)
        by_reason.setdefault(reason, []).append(path)
    for reason, paths in by_reason.items():
        shown = ", ".join(paths[:3]) + (f", ... ({len(paths) - 3} more)" if len(paths) > 3 else "")
        print(f"  copied unchanged ({reason}): {len(paths)}: {shown}")
    for path, reason in report.failed:
        print(f"  failed, not in the output: {path} ({reason})")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
