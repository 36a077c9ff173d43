"""The main job: makes the embedded datasets, runs every workload side by side, prints the table and
writes bench-results/<timestamp>/{results.json, results.md, results.png}.

    python -m benchmarks.main [--quick] [--workloads decode_crop ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks import augment, batch_decode, datasets, decode_crop, loader, loader_scale, policies, seed_experiment
from benchmarks.harness import environment, save, table
from gpupipe import _C

WORKLOADS = ("decode_crop", "restart", "batch_threads", "rrc", "huffman", "entropy_index", "backends", "augment",
             "policies", "loader", "recipe", "loader_scale", "seed")


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (< 2 minutes)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bench-results/<timestamp>)")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else 9

    sets = {name: datasets.load_set(name) for name in datasets.SETS}
    for name, datas in sets.items():
        print(f"set {name}: {len(datas)} images, {datasets.bits_per_pixel(datas, datasets.SETS[name]):.2f} bpp")
    rows = []
    # The decode workloads compare decoders on the same boxes call after call: without the entropy
    # index, which would start every call after the first from rows the earlier ones learned (a
    # training epoch draws new crops). Its own workload and the Loader's (epochs) run with it.
    index_paused = _C._pause_entropy_index(True)
    if "decode_crop" in args.workloads:
        rows += decode_crop.run(sets, repeats=repeats)
    if "restart" in args.workloads:
        rows += decode_crop.restart_markers(sets["hd"], repeats=repeats)
        rows += decode_crop.restart_markers(sets["seed"], repeats=repeats, label="seed 800x533")
    if "batch_threads" in args.workloads:
        rows += batch_decode.thread_scaling(sets["seed"], repeats=repeats)
    if "rrc" in args.workloads:
        rows += batch_decode.random_resized_crop(sets["hd"], threads=1, repeats=repeats)
        rows += batch_decode.random_resized_crop(sets["hd"], threads=2, repeats=repeats)
    if "huffman" in args.workloads:
        rows += batch_decode.huffman_reader({k: sets[k] for k in ("seed", "imagenet", "hd")}, repeats=repeats)
    if "backends" in args.workloads:
        rows += batch_decode.backends(sets["seed"], sets["hd"], repeats=repeats)
    _C._pause_entropy_index(index_paused)
    if "entropy_index" in args.workloads:
        rows += batch_decode.entropy_index({k: sets[k] for k in ("seed", "imagenet", "hd")}, repeats=repeats)
    if "augment" in args.workloads:
        rows += augment.run(threads=1, repeats=repeats)
        rows += augment.run(threads=2, repeats=repeats)
    if "policies" in args.workloads:
        rows += policies.run(repeats=repeats)
    if "loader" in args.workloads:
        rows += loader.run(repeats=1 if args.quick else 5, n=256 if args.quick else 512)
    if "recipe" in args.workloads:
        rows += loader.recipe(repeats=1 if args.quick else 5, n=256 if args.quick else 512)
    if "loader_scale" in args.workloads:
        rows += loader_scale.run(repeats=1 if args.quick else 3,
                                 names=("160x120", "400x300") if args.quick else ("160x120", "400x300", "seed", "hd"))
    extra = ""
    if "seed" in args.workloads:
        _, extra = seed_experiment.run(steps=6 if args.quick else 12, n=512 if args.quick else 1024)

    title = "gpupipe vs peers (CPU)"
    print(table(rows, "gpupipe") + extra)
    out = args.out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    save(rows, environment(threads=1), out, title, "gpupipe")
    if extra:
        with open(out / "results.md", "a") as f:
            f.write(extra + "\n")
    print(f"\nwrote {out}/results.json, results.md, results.png")
    return out


if __name__ == "__main__":
    main()
