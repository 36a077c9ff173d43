"""Where the Loader's Python threads spend their samples, from a ``py-spy record --threads --format raw``
file (collapsed stacks: ``thread (tid): name;frame;...;leaf count``): the functions all threads were
in (self samples, line numbers dropped), then per thread name, busiest first. With ``--gil`` py-spy
samples only the thread holding the GIL: who keeps the others waiting. (A name is the thread's when
sampled; the Loader's stage threads are made per epoch, so a reused thread id may carry another's
name in py-spy's table: trust the functions more than the names.)

    py-spy record --threads --rate 250 --format raw -o run.raw -- python -m gpupipe bench ...
    python -m benchmarks.pyspy_summary run.raw [--top 6] [--skip MainThread]
"""

from __future__ import annotations

import argparse
import collections
import re

_LINE = re.compile(r" \([^()]*:\d+\)$")  # "fn (file.py:123)" -> "fn (file.py)"
_NUMBERED = re.compile(r"[-_]?\d+$")  # a pool's numbered threads count as one name


def _frame(frame: str) -> str:
    return _LINE.sub(lambda m: " (" + m.group(0)[2:].rsplit(":", 1)[0] + ")", frame)


def summarise(lines, top: int = 6, skip: tuple = ()) -> str:
    per_thread: dict = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        name = _NUMBERED.sub("", name.split(" (")[0]) or name
        if name in skip:
            continue
        totals[name] += int(count)
        per_thread[name][_frame(frames[-1])] += int(count)
    everything = sum(totals.values()) or 1
    out = [f"py-spy samples: {everything}"]
    overall: collections.Counter = sum(per_thread.values(), collections.Counter())
    out += ["all threads:"] + [f"    {100 * k / everything:5.1f}%  {frame[:150]}" for frame, k in overall.most_common(2 * top)]
    for name, n in totals.most_common():
        out.append(f"{name}: {n} samples ({100 * n / everything:.0f}%)")
        for frame, k in per_thread[name].most_common(top):
            out.append(f"    {100 * k / n:5.1f}%  {frame[:150]}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--skip", nargs="*", default=[])
    args = ap.parse_args(argv)
    with open(args.raw) as f:
        print(summarise(f, args.top, tuple(args.skip)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
