"""``python -m gpupipe bench``: your data, your recipe, this machine: the gpupipe Loader next to
``torch.utils.data.DataLoader`` with torchvision's transforms (and DALI when installed), on the same
files with the same recipe.

Each pipeline runs in turn (round robin over the repeats, one at a time so none competes with
another's threads): a fresh iterator, warm-up batches, then timed batches. A "training step" is the
consumer's loop body: nothing by default (the pipeline's own pace), or ``--step-ms`` of sleep (a
GPU step leaves the CPU free) to see how long the step waits for data.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

import gpupipe
from gpupipe import _C
from gpupipe.bench import recipes, report
from gpupipe.bench.dataset import DEFAULT_IMAGES, BenchData, DataError, PilDataset, PilTarDataset, open_data
from gpupipe.error_policy import SampleFailure
from gpupipe.routing import probe
from gpupipe.sources import TarShards

METHODS = ("gpupipe", "raw", "dataloader", "dali")
# Seeds below 2**63: DALI's pipeline seed and torch.Generator's take an int64 (the Loader's are keyed
# modulo 2**64, so any of these is its own).
SEED_LIMIT = 2**63


def peer_seed(seed: int, epoch: int) -> int:
    """The DataLoader's and DALI's seed for an epoch: one per (seed, epoch), always an int64."""
    return (seed * 1000 + epoch) % SEED_LIMIT


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def build_parser() -> argparse.ArgumentParser:
    unavailable = [f"{name} ({r.missing()})" for name, r in recipes.RECIPES.items() if r.missing()]
    ap = argparse.ArgumentParser(
        prog="python -m gpupipe bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="recipes:\n" + "\n".join(f"  {n}: {recipes.RECIPES[n].summary}" for n in recipes.available())
        + ("\nnot available here: " + "; ".join(unavailable) if unavailable else ""))
    ap.add_argument("--data", default=None, metavar="PATH",
                    help="an ImageFolder tree, a folder of images, a .csv file list (path,label) or .tar shards / a "
                         "folder of them (default: a set made from scikit-image's photos, cached)")
    ap.add_argument("--recipe", default="train", choices=recipes.available())
    ap.add_argument("--device", default="cpu", help="where batches are delivered: cpu or cuda[:N] (default cpu)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=_cores(),
                    help="gpupipe decode threads = DataLoader num_workers = DALI threads (default: the cores here, "
                         f"{_cores()})")
    ap.add_argument("--backend", default="auto", choices=gpupipe.backends.BACKEND_NAMES, help="the Loader's decode backend")
    ap.add_argument("--no-lookahead", dest="lookahead", action="store_false",
                    help="the Loader without lookahead: each epoch's pipeline fills after the last one drained")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed batches per repeat (default: one epoch's worth less the warm-up, at least 4 per "
                         "thread and at most 30 or 4 per thread; 5 with --quick)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed batches first (default 2 per thread, at least 2: the batches a DataLoader's workers "
                         "have queued before timing starts; 1 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per pipeline, median reported (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="few batches, one repeat: a smoke run, not a measurement")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="simulate a training step of this many ms per batch (sleep) and report how long it waits for data")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="pipelines to run")
    ap.add_argument("--images", type=int, default=DEFAULT_IMAGES, help="size of the default data set (without --data)")
    ap.add_argument("--seed", type=int, default=0, help="0 .. 2**63 - 1 (default 0)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder, created and checked before anything is measured (default "
                         "./gpupipe-bench/<timestamp>)")
    return ap


# --- the pipelines, each as: fresh per repeat, batches() crossing epochs, stats(), close() ----------


class LoaderRun:
    """The gpupipe Loader with the recipe's pieces."""

    def __init__(self, data: BenchData, parts: recipes.RecipeParts, args, device: torch.device, epoch: int = 0,
                 keep_ahead: bool = False):
        extra = {"batch_transform": parts.batch_transform} if parts.batch_transform is not None else {}
        augment = parts.augment.to(device) if parts.augment is not None else None
        self.loader = gpupipe.Loader(data.source, batch_size=args.batch_size, crop=parts.crop, augment=augment,
                                     device=device, backend=args.backend, num_threads=args.threads, seed=args.seed,
                                     drop_last=True, lookahead=getattr(args, "lookahead", True), **extra)
        self.epoch = epoch
        # Closed after a timed run, the Loader drops the epoch it started ahead (lookahead), so that
        # none of its work runs while the next pipeline is timed; keep_ahead: its next run takes it,
        # as the next epoch of a training run does (runs of this Loader back to back).
        self.keep_ahead = keep_ahead
        self._it = None
        self._ended: dict = {}  # the stats of the epochs this run has left, added up

    def batches(self):
        try:
            while True:
                self.loader.set_epoch(self.epoch)
                self._it = iter(self.loader)
                got = False
                for batch in self._it:
                    got = True
                    yield batch
                if not got:
                    raise RuntimeError(f"the Loader delivered no batch: {_skipped(self.loader.stats())}")
                self._end_epoch()
                self.epoch += 1
        finally:  # a caller done with these batches: the epoch's stage threads stop now
            self.close()

    def stats(self) -> dict:
        """``Loader.stats()`` of every epoch this run has iterated, added up (``add_stats``): the
        Loader's own covers only the epoch it is in, which the timed batches may cross."""
        return self._ended if self._it is None else add_stats(_epoch_stats(self.loader), self._ended)

    def _end_epoch(self):
        self._ended = add_stats(_epoch_stats(self.loader), self._ended)
        self._it = None

    def close(self):
        if self._it is not None:
            it = self._it
            self._end_epoch()
            if hasattr(it, "close"):
                it.close()
        if not self.keep_ahead:
            self.loader._drop_ahead()


def _epoch_stats(loader: gpupipe.Loader) -> dict:
    """``loader.stats()`` with the decode pool's thread-seconds over the epoch's wall time
    (``decoding_s``, what its utilisation is of), so that utilisations of several epochs add up."""
    stats = loader.stats()
    pool = stats.get("decode_pool")
    if isinstance(pool, dict) and "utilisation" in pool:
        stats["decode_pool"] = {**pool, "decoding_s": pool["utilisation"] * pool["threads"] * stats["wall_s"]}
    return stats


# Loader.stats() keys that add up over epochs and repeats; the others (shares, threads, the process's
# entropy index) describe the latest one.
_ADDED = ("images", "batches", "wall_s", "wait_s")
_ADDED_MAPS = ("busy_s", "host_s", "routes", "failures")
_LISTS = ("skipped", "replaced", "fallback", "warnings")


def add_stats(newer: dict, older: dict, sign: int = 1) -> dict:
    """``older + newer`` (``sign`` 1) or ``newer - older`` (``sign`` -1: ``older`` an earlier
    snapshot of what became ``newer``) of ``Loader.stats()`` records: counts, seconds and lists
    added up, rates recomputed, other keys ``newer``'s."""
    if not older:
        return dict(newer)
    if not newer:
        return dict(older) if sign > 0 else {}
    out = {**older, **newer}
    for key in _ADDED:
        if key in out:
            out[key] = newer.get(key, 0) + sign * older.get(key, 0)
    for key in _ADDED_MAPS:
        if key in out:
            a, b = newer.get(key) or {}, older.get(key) or {}
            out[key] = {k: a.get(k, 0) + sign * b.get(k, 0) for k in {**b, **a}}
    for key in _LISTS:
        if key in out:
            a, b = list(newer.get(key) or []), list(older.get(key) or [])
            out[key] = b + a if sign > 0 else a[len(b):]
    wall, images = out.get("wall_s", 0.0), out.get("images", 0)
    if "images_per_s" in out:
        out["images_per_s"] = images / wall if wall > 0 else 0.0
    if "host_us_per_image" in out:
        out["host_us_per_image"] = 1e6 * sum(out["host_s"].values()) / images if images else 0.0
    a, b = newer.get("decode_pool"), older.get("decode_pool")
    if isinstance(a, dict) and isinstance(b, dict) and "decoding_s" in a and "decoding_s" in b:
        pool = {**a, "busy_s": a["busy_s"] + sign * b["busy_s"], "decoding_s": a["decoding_s"] + sign * b["decoding_s"]}
        pool["utilisation"] = min(pool["decoding_s"] / (pool["threads"] * wall), 1.0) if wall > 0 else 0.0
        out["decode_pool"] = pool
    a, b = newer.get("engines"), older.get("engines")
    if isinstance(a, dict) and isinstance(b, dict):
        engines = {}
        for name in {**b, **a}:
            e, f = a.get(name, {}), b.get(name, {})
            n, g, t = (e.get(k, 0) + sign * f.get(k, 0) for k in ("images", "given", "seconds"))
            engines[name] = {"images": n, "given": g, "seconds": t, "images_per_s": n / t if t > 0 else 0.0}
        out["engines"] = engines
    return out


class RawDecodeRun:
    """The Loader's ceiling: ``decode_crop_jpegs`` on the same files already in memory, the same
    boxes (the recipe's crop sampler, keyed as the Loader's), the same threads, backend and device,
    into one reused buffer; no read, no augmentation. Boxes are drawn before the timed loop, from
    headers read once. Samples that fail are left out of the batch, as the Loader's ``on_error="skip"``
    does, and counted in ``stats()["skipped"]``."""

    def __init__(self, data: BenchData, parts: recipes.RecipeParts, args, device: torch.device, epoch: int = 0):
        if not isinstance(data.source, gpupipe.sources.MapSource):
            raise ValueError("the raw decode row needs a folder or file list (tar shards are streamed)")
        self.source, self.crop, self.args, self.device, self.epoch = data.source, parts.crop, args, device, epoch
        self.datas = gpupipe.sources.read_files(self.source.keys, args.threads)
        bad = [k for k, d in zip(self.source.keys, self.datas) if isinstance(d, BaseException)]
        if bad:
            raise ValueError(f"{len(bad)} files could not be read, first {bad[0]!r}")
        infos = probe(self.datas)
        self.heights, self.widths = infos.sizes(displayed=False)
        h, w = parts.crop.size
        # where the Loader decodes: its host buffers (pinned, then copied) for the CPU core, the device
        # for a GPU backend
        if gpupipe.backends.resolve(args.backend, device) == "cpu":
            # two pinned buffers, each decoded into again once its copy to the device is done (the
            # Loader's ring does the same): one buffer was overwritten while its copy could still run
            self.outs = [torch.empty((args.batch_size, h, w, 3), dtype=torch.uint8, pin_memory=device.type == "cuda")
                         for _ in range(2 if device.type == "cuda" else 1)]
        else:
            self.outs = [torch.empty((args.batch_size, h, w, 3), dtype=torch.uint8, device=device)]
        self.copied: list = [None] * len(self.outs)  # the CUDA event after each buffer's last copy
        self.images, self.batches_done, self.skipped = 0, 0, []

    def _epoch(self, epoch: int):
        order = gpupipe.sources.distributed_indices(len(self.source), epoch=epoch, seed=self.args.seed, shuffle=True,
                                                    rank=0, world_size=1, drop_last=True)
        bs = self.args.batch_size
        order = order[:len(order) // bs * bs]
        boxes, _ = self.crop.plan(self.heights[order], self.widths[order], seed=self.args.seed, epoch=epoch,
                                  indices=order)
        return order, boxes

    def batches(self):
        bs, size = self.args.batch_size, self.crop.size if self.crop.resize else None
        labels = torch.from_numpy(self.source.labels)
        while True:
            order, boxes = self._epoch(self.epoch)
            decoded = 0
            for first in range(0, len(order), bs):
                rows = order[first:first + bs]
                slot = self.batches_done % len(self.outs)
                if self.copied[slot] is not None:
                    self.copied[slot].synchronize()
                out = self.outs[slot]
                batch = gpupipe.decode_crop_jpegs([self.datas[i] for i in rows], boxes[first:first + bs], size=size,
                                                  out=out, num_threads=self.args.threads, on_error="skip",
                                                  window=self.crop.window, dct_scaling=self.crop.dct_scaling,
                                                  backend=self.args.backend, device=out.device)
                images, batch_labels = batch.images, labels[rows]
                if batch.kinds:  # only where samples failed: the good ones, as the Loader delivers them
                    self.skipped += [SampleFailure(self.source.keys[rows[i]], kind, batch.errors[i])
                                     for i, kind in batch.kinds.items()]
                    images, batch_labels = images[batch.ok.to(images.device)], batch_labels[batch.ok]
                if images.device != self.device:
                    images = images.to(self.device, non_blocking=True)
                    self.copied[slot] = torch.cuda.Event()
                    self.copied[slot].record(torch.cuda.current_stream(self.device))
                self.images += images.shape[0]
                self.batches_done += 1
                decoded += images.shape[0]
                yield images, batch_labels
            if not decoded:
                first = self.skipped[-len(order)]
                raise RuntimeError(f"raw decode_crop_jpegs decoded no image in epoch {self.epoch}: all {len(order)} "
                                   f"samples failed; first: {first.key!r}: {first.message}")
            self.epoch += 1

    def stats(self) -> dict:
        """What it decoded in the batches so far, as ``Loader.stats()`` names it."""
        return {"images": self.images, "batches": self.batches_done, "skipped": list(self.skipped)}

    def close(self):
        self.datas = None


def _skipped(stats: dict) -> str:
    skipped = stats.get("skipped") or []
    if not skipped:
        return "no sample decoded"
    first = skipped[0]
    said = f"{first.key!r}: {first.message}" if isinstance(first, SampleFailure) else str(first)
    return f"{len(skipped)} samples skipped, first: {said}"


class DataLoaderRun:
    """``torch.utils.data.DataLoader`` with the recipe's torchvision transform, PIL decode,
    ``num_workers`` = the threads given."""

    def __init__(self, data: BenchData, parts: recipes.RecipeParts, args, device: torch.device, epoch: int = 0):
        ds = self.dataset(data, parts, args)
        workers = args.threads
        self.dl = torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, shuffle=not isinstance(ds, torch.utils.data.IterableDataset),
            num_workers=workers,
            collate_fn=parts.torchvision_collate, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
            drop_last=True,
            generator=torch.Generator().manual_seed(peer_seed(args.seed, epoch)))
        self.device = device

    @staticmethod
    def dataset(data: BenchData, parts: recipes.RecipeParts, args) -> torch.utils.data.Dataset:
        """The per-sample dataset: the files decoded with PIL, then ``parts.torchvision`` (tar shards
        streamed); a subclass may time another dataset in the same DataLoader."""
        if isinstance(data.source, TarShards):
            return PilTarDataset(data.source, parts.torchvision, seed=args.seed)
        return PilDataset(data.source, parts.torchvision)

    def batches(self):
        while True:
            got = False
            for images, labels in self.dl:
                got = True
                if self.device.type == "cuda":
                    images = images.to(self.device, non_blocking=True)
                    labels = labels.to(self.device, non_blocking=True)
                yield images, labels
            if not got:
                raise RuntimeError("the DataLoader delivered no batch")

    def stats(self) -> dict:
        return {}

    def close(self):
        it = getattr(self.dl, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.dl = None
        gc.collect()


def dali_missing() -> Optional[str]:
    try:
        import nvidia.dali  # noqa: F401
    except Exception as e:
        return f"nvidia-dali-cuda120 not installed ({type(e).__name__})"
    return None


DALI_PRINTED: set = set()  # what DALI's pipelines printed while being built (its bundled nvImageCodec's lines)
DALI_RUN_PRINTED: set = set()  # what they printed while running (its decoders' complaints about the data)


def _without_colours(lines) -> set:
    return {re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines}


class DaliRun:
    """A DALI pipeline of the same recipe: its file or webdataset reader, its decoders (nvJPEG on
    CUDA, CPU operators otherwise) and operators."""

    def __init__(self, data: BenchData, parts: recipes.RecipeParts, args, device: torch.device, epoch: int = 0):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        cuda = device.type == "cuda"
        src = data.source

        @pipeline_def(batch_size=args.batch_size, num_threads=args.threads, seed=peer_seed(args.seed, epoch),
                      device_id=(device.index or 0) if cuda else None, exec_dynamic=True)
        def pipe():
            if isinstance(src, TarShards):
                jpegs, labels = fn.readers.webdataset(paths=src.paths, ext=["jpg;jpeg;png;webp;bmp;ppm", "cls"],
                                                      random_shuffle=True, name="reader")
            else:
                jpegs, labels = fn.readers.file(files=list(src.keys), labels=[int(v) for v in src.labels],
                                                random_shuffle=True, name="reader")
            return parts.dali(fn, types, jpegs, "mixed" if cuda else "cpu"), labels

        from gpupipe._backends import dali as dali_backend

        self.pipe = pipe()
        self._captured = dali_backend._stderr_captured
        with self._captured() as printed:  # its start-up lines go into the report, not to stderr
            self.pipe.build()
        DALI_PRINTED.update(_without_colours(printed))
        self.device = device

    def batches(self):
        # Its decoders' complaints about the data ("[ERROR] [jpeg_parser] Invalid marker") come from
        # its own threads, during and between runs (it works ahead): caught while it is iterated, into
        # the report and the error of a run that fails, which says what went wrong only there. Other
        # lines written meanwhile (the progress bar) reach stderr when the iteration ends.
        printed: list = []
        try:
            with self._captured() as printed:
                try:
                    while True:
                        images, labels = self.pipe.run()
                        yield self.to_torch(images), labels
                except Exception:
                    self.close()  # a failed pipeline is done: its threads stop (and print) before the capture ends
                    raise
        except Exception as e:
            if printed:
                raise RuntimeError(f"{e}\n{_PRINTED} {' | '.join(sorted(_without_colours(printed)))}") from e
            raise
        finally:
            DALI_RUN_PRINTED.update(_without_colours(printed))

    def to_torch(self, images) -> torch.Tensor:
        """One batch of the pipeline's images as a tensor on the device (on the CPU, DALI's buffer)."""
        t = images.as_tensor()
        if self.device.type == "cuda":
            from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

            x = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=self.device)
            feed_ndarray(t, x, cuda_stream=torch.cuda.current_stream(self.device))
            return x
        return torch.from_numpy(np.asarray(t))

    def stats(self) -> dict:
        return {}

    def close(self):
        self.pipe = None
        gc.collect()


# --- measuring ---------------------------------------------------------------------------------------


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(run, *, warmup: int, steps: int, step_s: float, device: torch.device, bar=None,
            keep_open: bool = False) -> tuple:
    """(seconds, images, seconds waited, stats) of ``steps`` timed batches after ``warmup``: stats
    of the timed batches alone (``add_stats``: what the run's ``stats()`` gained meanwhile). The run
    is closed after, unless ``keep_open`` (a caller measuring it again: its iteration is closed, the
    pipeline kept, as a training run keeps its Loader)."""
    it = None
    try:
        it = run.batches()
        for _ in range(warmup):
            next(it)
            if bar is not None:
                bar.update(1)
        _sync(device)
        before = run.stats()
        images, waited = 0, 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            t1 = time.perf_counter()
            x, _ = next(it)
            waited += time.perf_counter() - t1
            images += x.shape[0]
            if step_s:
                time.sleep(step_s)  # a GPU step: the CPU is free meanwhile
            if bar is not None:
                bar.update(1)
        _sync(device)
        seconds = time.perf_counter() - t0
        return seconds, images, waited, add_stats(run.stats(), before, sign=-1)
    finally:
        if not keep_open:
            run.close()
        if it is not None:  # now, not when collected: an iteration may hold threads or stderr (DALI's)
            it.close()


def _progress(total: int, quiet: bool):
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="batch", desc="gpupipe bench", file=sys.stderr, disable=None)


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return device


def _check_args(args) -> None:
    for name in ("batch_size", "threads", "images"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("steps", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if not math.isfinite(args.step_ms) or args.step_ms < 0:
        raise ValueError(f"--step-ms must be a finite number of milliseconds >= 0, got {args.step_ms}")
    if not 0 <= args.seed < SEED_LIMIT:
        raise ValueError(f"--seed must be within 0 .. 2**63 - 1, got {args.seed}")


def _schedule(args, images: int) -> tuple[int, int, int]:
    """(warm-up batches, repeats, timed batches). Steady state, not a pipeline's fill: a
    DataLoader's workers each queue prefetch_factor (2) batches, which a short run would time as if
    free (16 workers deliver their first 16 batches at once). So the warm-up drains them, and the
    timed batches cross epochs where one is short."""
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else max(2, 2 * args.threads))
    repeats = args.repeats or (1 if args.quick else 3)
    per_epoch = max(1, images // args.batch_size)
    steady = 4 * args.threads
    steps = args.steps or (min(5, per_epoch) if args.quick else min(max(30, steady), max(per_epoch - warmup, steady)))
    return warmup, repeats, steps


def _pipelines(args, device: torch.device, parts, steps: int) -> tuple[list, list]:
    """The asked-for pipelines: their result records (skipped where they cannot run) and classes."""
    kinds = {"gpupipe": ("gpupipe Loader", LoaderRun, None, "threads, ROI decode, batched augment"),
             "raw": ("raw decode_crop_jpegs", RawDecodeRun, None,
                     "the same files in memory, same boxes, threads, backend and device; no read, no augment: the "
                     "Loader's ceiling"),
             "dataloader": (f"DataLoader ({args.threads} workers)", DataLoaderRun, None, "PIL + torchvision transforms"),
             "dali": ("DALI " + ("GPU" if device.type == "cuda" else "CPU"), DaliRun,
                      dali_missing() or (None if parts.dali else "this recipe has no DALI version"),
                      "same recipe in DALI operators")}
    results, runners = [], []
    for key in METHODS:
        if key in args.methods:
            name, cls, missing, note = kinds[key]
            results.append(report.Result(name, note, batches=steps, batch_size=args.batch_size, skipped=missing))
            runners.append(cls)
    return results, runners


# DALI's lines that say nothing of the cause: its error's first line repeats, its last says the
# pipeline is now unusable
_DALI_NOISE = ("Critical error in pipeline", "Current pipeline object is no longer valid")
_PRINTED = "DALI printed:"  # the line DaliRun adds to a failed run's error: what DALI's decoders printed


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception as one table cell: its type and first line; for an error re-raised from a
    DataLoader worker ("Caught X in DataLoader worker process 0. Original Traceback ..."), the
    original's last line, which names the file; for a DALI pipeline's ("Critical error in
    pipeline: Error in CPU operator ... encountered: <cause>"), the operator and the cause."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    printed = [line for line in lines if line.startswith(_PRINTED)]
    lines = [line for line in lines if not line.startswith(_PRINTED)]
    if len(lines) > 1 and any(line.startswith("Original Traceback") for line in lines):
        text = f"{lines[-1]} (in a DataLoader worker)"
    elif lines and lines[0].startswith(_DALI_NOISE):
        said = [line for line in lines if not line.startswith(_DALI_NOISE)]
        operator = next((line.rstrip(",") for line in said if line.startswith("Error in ")), None)
        cause = said[said.index("encountered:") + 1:] if "encountered:" in said else said[-1:]
        text = f"{type(e).__name__}: " + ": ".join(filter(None, [operator, " ".join(cause)]))
    else:
        text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    text = "; ".join([text, *printed])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_all(results, runners, data, parts, args, device, warmup: int, repeats: int, steps: int):
    """Every live pipeline, ``repeats`` times in turn; returns the Loader's stats over its timed
    batches, every repeat's added up (None when it did not run)."""
    bar = _progress(repeats * sum(not r.skipped for r in results) * (warmup + steps), quiet=args.quick)
    loader_stats = None
    for rep in range(repeats):
        for result, cls in zip(results, runners):
            if result.skipped:
                continue
            # Every pipeline starts with an empty entropy index: the Loader and the raw decode read the
            # same bytes, and one timed after the other would start from the rows it learned (1.13x).
            _C.clear_entropy_index()
            try:
                seconds, images, waited, stats = measure(cls(data, parts, args, device, epoch=rep), warmup=warmup,
                                                         steps=steps, step_s=args.step_ms / 1e3, device=device, bar=bar)
                if not images:
                    raise RuntimeError(f"no image in the {steps} timed batches: {_skipped(stats)}")
            except Exception as e:  # reported in the table, the other pipelines still run
                result.skipped = f"failed: {one_line(e)}"
                continue
            result.seconds.append(seconds)
            result.images.append(images)
            result.waited.append(waited)
            result.failed_samples.append(len(stats["skipped"]) if "skipped" in stats else None)
            if cls is LoaderRun:
                loader_stats = add_stats(stats, loader_stats or {})
    if bar is not None:
        bar.close()
    return loader_stats


def _notes(parts: recipes.RecipeParts, results: list) -> list:
    """The recipe's notes that apply to what ran (its DALI notes only where DALI ran)."""
    dali_ran = any(r.method.startswith("DALI") and not r.skipped for r in results)
    return list(parts.notes) + (list(parts.dali_notes) if dali_ran else [])


def _print_summary(results, baseline, loader_stats, parts, args, batches: int) -> Optional[float]:
    """The tables and the "keeps a GPU fed" line; returns that step time (ms) when measured."""
    print()
    print(report.table(results, baseline, args.step_ms))
    gp = results[0] if results and results[0].method == "gpupipe Loader" else None
    raw = next((r for r in results if r.method.startswith("raw ") and not r.skipped), None)
    fed_ms = None
    if gp is not None and not gp.skipped:
        if raw is not None:
            print(f"\ngpupipe Loader / raw decode_crop_jpegs on the same bytes in memory: "
                  f"{gp.images_per_s / raw.images_per_s:.2f}x")
        if loader_stats:
            timed = int(loader_stats.get("batches") or batches)
            print(f"\nthe Loader's stages over its timed batches ({timed} in {len(gp.seconds)} repeat(s), added up):")
            print(report.stage_table(loader_stats, timed))
            print("(stages overlap: busy times add up to more than the wall time when they run in parallel)")
        print()
        if args.step_ms:
            print(f"with a {args.step_ms:g} ms training step at batch {args.batch_size}, the step waits for the Loader "
                  f"{100 * gp.wait_fraction:.0f}% of the time")
        else:
            # per full batch: seconds per delivered image times the batch size (failed samples skipped)
            fed_ms = gp.ms_per_batch
            others = [f"{r.method}: {r.ms_per_batch:.1f} ms" for r in results[1:] if not r.skipped]
            print(f"gpupipe keeps a GPU fed down to {fed_ms:.1f} ms/step at batch {args.batch_size}"
                  + (f" ({', '.join(others)})" if others else "")
                  + "; a slower training step never waits for data"
                  + (f" ({gp.failed} samples failed to decode and were skipped)" if gp.failed else ""))
    for note in _notes(parts, results):
        print(f"note: {note}")
    if DALI_PRINTED:
        print(f"note: DALI printed while building its pipeline: {' | '.join(sorted(DALI_PRINTED))[:400]}")
    if DALI_RUN_PRINTED:
        print(f"note: DALI printed while running: {' | '.join(sorted(DALI_RUN_PRINTED))[:400]}")
    return fed_ms


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    DALI_PRINTED.clear()  # this run's lines only (a process may run the bench more than once)
    DALI_RUN_PRINTED.clear()
    try:
        _check_args(args)
        device = _device(args.device)
        data = open_data(args.data, images=args.images, progress=not args.quick)
        if data.images < args.batch_size:
            raise ValueError(f"--batch-size {args.batch_size} is larger than the data set ({data.describe()})")
        recipe = recipes.get(args.recipe)
        parts = recipe.build(data.num_classes)
        LoaderRun(data, parts, args, device)  # a clear error now for a backend that cannot run here
        out = report.output_folder(args.out or Path("gpupipe-bench") / time.strftime("%Y%m%d-%H%M%S"))
    except (DataError, ValueError, RuntimeError) as e:
        print(f"gpupipe bench: {e}", file=sys.stderr)
        return 2

    warmup, repeats, steps = _schedule(args, data.images)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    results, runners = _pipelines(args, device, parts, steps)
    backend = gpupipe.backends.resolve(args.backend, device)
    print(f"gpupipe bench: recipe {recipe.name}: {recipe.summary}")
    print(f"data: {data.describe()}")
    print(f"device {device}, batch {args.batch_size}, {args.threads} threads, Loader backend {backend}; "
          f"{repeats} repeat(s) of {warmup} warm-up + {steps} timed batches per pipeline"
          + (f"; a {args.step_ms:g} ms training step" if args.step_ms else ""))
    loader_stats = _run_all(results, runners, data, parts, args, device, warmup, repeats, steps)
    baseline = next((r for r in results if r.method.startswith("DataLoader") and not r.skipped), None)
    fed_ms = _print_summary(results, baseline, loader_stats, parts, args, warmup + steps)

    arg_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    arg_dict.update(warmup=warmup, repeats=repeats, steps=steps, backend_resolved=backend)
    report.save_json(out / "results.json", args=arg_dict, env=report.environment(args.threads),
                     data={"kind": data.kind, "path": data.path, "images": data.images, "classes": data.classes,
                           **({"left_out": list(data.left_out)} if data.left_out else {})},
                     recipe={"name": recipe.name, "summary": recipe.summary, "notes": _notes(parts, results),
                             "gpupipe": {"crop": repr(parts.crop), "augment": repr(parts.augment),
                                         "batch_transform": repr(parts.batch_transform)},
                             "torchvision": repr(parts.torchvision)},
                     results=results, baseline=baseline, loader_stats=loader_stats, fed_ms=fed_ms,
                     batch_size=args.batch_size)
    title = f"{recipe.name} recipe, {data.kind} data ({data.images} images), batch {args.batch_size}, {args.threads} threads, {device}"
    why_no_plot = report.plot(out / "results.png", results, baseline, title, loader_stats)
    print(f"\nwrote {out / 'results.json'}" + (f"; {why_no_plot}" if why_no_plot else f", {out / 'results.png'}"))
    gp = results[0] if results and results[0].method == "gpupipe Loader" else None
    measured = any(not r.skipped for r in results)
    if not measured:
        print("gpupipe bench: no pipeline was measured (see the table)", file=sys.stderr)
    return 1 if not measured or (gp is not None and gp.skipped) else 0


__all__ = ["DaliRun", "DataLoaderRun", "LoaderRun", "RawDecodeRun", "add_stats", "build_parser", "main", "measure",
           "peer_seed"]
