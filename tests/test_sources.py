"""The sources' listings and records where a user's data is messy (found by an audit of the sources):
ImageFolder as torchvision's DatasetFolder, CSV lists as spreadsheets write them, tar shards cut or
keyed unusually, keys changed in place, and prepare over symlinked trees and compressed shards.
Each case names the sample or fails loudly; none is lost, mislabelled or hangs."""

from __future__ import annotations

import io
import os
import tarfile
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import gpupipe
import gpupipe.__main__
from gpupipe import crops
from gpupipe.data import DecodeCropDataset
from gpupipe.prepare import prepare
from gpupipe.sources import FileList, ImageFolder, TarShards, write_tar_shards
from helpers import run_child


def jpeg(value: int, size: int = 24) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def tree(root, layout: dict) -> None:
    """``{relative path: bytes}`` written under ``root``."""
    for rel, data in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def records(shards: TarShards, **kw) -> list:
    return list(shards.epoch_samples(epoch=0, seed=0, shuffle=False, rank=kw.get("rank", 0),
                                     world_size=kw.get("world_size", 1), drop_last=False))


# --- ImageFolder -------------------------------------------------------------------------------------


def test_image_folder_takes_a_string_extension_and_refuses_empty_classes_as_torchvision(tmp_path):
    from torchvision.datasets import DatasetFolder

    tree(tmp_path, {f"a/x.{e}": jpeg(1) for e in ("jpg", "png", "tmp", "jpeg", "svg", "zip")})
    ours = ImageFolder(tmp_path, extensions=".jpg")
    theirs = DatasetFolder(str(tmp_path), loader=lambda p: p, extensions=".jpg")
    assert list(ours.keys) == [p for p, _ in theirs.samples] == [str(tmp_path / "a" / "x.jpg")]
    os.makedirs(tmp_path / "b")  # a class without an image: torchvision raises, naming it
    with pytest.raises(FileNotFoundError, match="no valid file for the class b"):
        ImageFolder(tmp_path)
    kept = ImageFolder(tmp_path, allow_empty=True)
    assert kept.classes == ["a", "b"] and kept.labels.tolist() == [0, 0, 0]  # x.jpeg, x.jpg, x.png


def test_image_folder_never_loops_through_a_link_to_a_folder_above(tmp_path):
    tree(tmp_path, {f"cat/{i}.jpg": jpeg(i) for i in range(3)})
    os.symlink(tmp_path / "cat", tmp_path / "cat" / "again")  # os.walk would go round until ENAMETOOLONG
    os.symlink(tmp_path, tmp_path / "cat" / "up")  # with two, it would never return
    os.makedirs(tmp_path / "elsewhere")
    tree(tmp_path, {"elsewhere/e.jpg": jpeg(9)})
    os.symlink(tmp_path / "elsewhere", tmp_path / "cat" / "linked")  # not a loop: followed, as torchvision
    src = ImageFolder(tmp_path)
    assert sorted(os.path.relpath(k, tmp_path) for k in src.keys if "cat" in os.path.relpath(k, tmp_path).split(os.sep)[0]) \
        == ["cat/0.jpg", "cat/1.jpg", "cat/2.jpg", "cat/linked/e.jpg"]


def test_image_folder_lists_each_real_folder_once_through_links_beside_each_other(tmp_path):
    """Two folders linking to each other (or two links to one folder): os.walk went round each
    cycle until the path was too long, listing files hundreds of times, and with two links each
    way never returned. Each real folder is listed once now (in a child: the code before hung)."""
    tree(tmp_path, {"c/a/x.jpg": jpeg(1), "c/b/y.jpg": jpeg(2)})
    for link, target in (("a/l1", "../b"), ("a/l2", "../b"), ("b/m1", "../a"), ("b/m2", "../a")):
        os.symlink(target, tmp_path / "c" / link)
    r = run_child(f"""
        from gpupipe.sources import ImageFolder
        print(sorted(ImageFolder({str(tmp_path)!r}).keys))
    """, timeout=60)
    listed = eval(r.stdout)
    assert [os.path.basename(k) for k in listed] == ["x.jpg", "y.jpg"], listed


def test_image_folder_says_which_folders_it_could_not_list(tmp_path, monkeypatch):
    """A folder os.walk cannot list (permission, a path over PATH_MAX) was left out silently, as
    torchvision's listing leaves it: now a warning names it; a tree too deep for os.walk is a
    ValueError naming the class instead of a RecursionError."""
    tree(tmp_path, {"c/x.jpg": jpeg(1), "c/sub/y.jpg": jpeg(2)})
    walk = os.walk

    def refusing(top, onerror=None, followlinks=False):
        for dirpath, dirnames, filenames in walk(top, onerror=onerror, followlinks=followlinks):
            if dirpath.endswith("sub"):
                onerror(PermissionError(13, "Permission denied", dirpath))
                continue
            yield dirpath, dirnames, filenames

    monkeypatch.setattr(os, "walk", refusing)
    with pytest.warns(UserWarning, match=r"could not list 1 folder\(s\).*sub \(Permission denied\)"):
        src = ImageFolder(tmp_path)
    assert [os.path.basename(k) for k in src.keys] == ["x.jpg"]

    def deep(*a, **kw):
        raise RecursionError("maximum recursion depth exceeded")
        yield

    monkeypatch.setattr(os, "walk", deep)
    with pytest.raises(ValueError, match="nest deeper than os.walk can list"):
        ImageFolder(tmp_path)


def test_a_state_is_taken_over_file_names_that_are_not_utf8(tmp_path):
    """Linux file names are bytes: one that is not UTF-8 comes back from os.walk escaped, and the
    dataset's fingerprint failed to encode it (UnicodeEncodeError from state_dict()). UTF-8 names
    hash as before (states taken before load)."""
    tree(tmp_path, {"c/a.jpg": jpeg(1)})
    with open(os.path.join(os.fsencode(tmp_path), b"c", b"bad\xff.jpg"), "wb") as f:
        f.write(jpeg(2))
    loader = gpupipe.Loader(ImageFolder(tmp_path), batch_size=1, crop=crops.CenterCrop(16), shuffle=False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = gpupipe.Loader(ImageFolder(tmp_path), batch_size=1, crop=crops.CenterCrop(16), shuffle=False)
    again.load_state_dict(state)
    assert len(list(again)) == 1
    import zlib

    plain = ["x/a.jpg", "x/b.jpg"]
    source = FileList(plain, [0, 0])
    expected = f"2:{zlib.crc32(chr(10).join(plain).encode()):08x}"  # (the hash of the states taken before)
    assert gpupipe.Loader(source, batch_size=1, crop=crops.CenterCrop(16))._source_fingerprint_before_moves() == expected


def test_a_key_set_in_place_is_read_from_its_new_file(tmp_path):
    tree(tmp_path, {"c/black.jpg": jpeg(0), "c/white.jpg": jpeg(255)})
    src = ImageFolder(tmp_path)
    assert src.read_many([0], 1)[0] == jpeg(0)  # (the encoded paths are made now)
    src.keys[0] = str(tmp_path / "c" / "white.jpg")
    assert bytes(src.read_many([0], 1)[0]) == src.read(0) == jpeg(255)
    src.keys.append(str(tmp_path / "c" / "black.jpg"))
    src.labels = np.append(src.labels, 0)
    assert bytes(src.read_many([2], 1)[0]) == jpeg(0)
    assert src.keys == [str(tmp_path / "c" / n) for n in ("white.jpg", "white.jpg", "black.jpg")]  # still a list


# --- FileList.from_csv -------------------------------------------------------------------------------


def test_csv_lists_as_spreadsheets_write_them(tmp_path):
    tree(tmp_path, {"img/a.jpg": jpeg(1), "img/b.jpg": jpeg(2)})
    (tmp_path / "bom.csv").write_text("\ufeffpath , label\nimg/a.jpg,1\n\n\"img/b.jpg\",2\n", encoding="utf-8")
    fl = FileList.from_csv(tmp_path / "bom.csv")
    assert list(fl.keys) == [str(tmp_path / "img" / "a.jpg"), str(tmp_path / "img" / "b.jpg")]
    assert fl.labels.tolist() == [1, 2]
    for name, text, match in (
            ("missing.csv", "file,label\na.jpg,1\n", r"no column 'path' in the header row \(its columns: \['file', 'label'\]\)"),
            ("late.csv", "path,label\nimg/a.jpg,1\n\n\n\"img/\nb.jpg\",x\n", r"late.csv, line 6: the label 'x' is not an integer"),
            ("underscore.csv", "path,label\nimg/a.jpg,1_000\n", r"line 2: the label '1_000' is not an integer"),
            ("digits.csv", "path,label\nimg/a.jpg,\u0663\n", r"line 2: the label '\u0663' is not an integer"),
            ("empty.csv", "path,label\n,3\n", r"line 2: the path is empty")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=match):
            FileList.from_csv(tmp_path / name)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:  # a relative CSV path: keys made absolute, so a later chdir changes nothing
        keys = list(FileList.from_csv("bom.csv").keys)
    finally:
        os.chdir(cwd)
    assert keys == list(fl.keys)


# --- TarShards ---------------------------------------------------------------------------------------


def test_a_shard_cut_after_a_samples_image_fails_that_sample_never_unlabelled(tmp_path):
    [path] = write_tar_shards([(f"s{i}", 7, jpeg(40 * i), "jpg") for i in range(3)], tmp_path, samples_per_shard=10)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:data.index(b"s1.cls")])  # an interrupted copy: s1's label lost with the rest
    got = records(TarShards(path))
    assert [(r.key.rsplit(":", 1)[-1], r.label, r.error is None) for r in got[:1]] == [("s0", 7, True)]
    assert "truncated right after this sample" in got[1].error and got[1].key.endswith(":s1")
    assert "truncated" in got[2].error and all(r.label == -1 for r in got[1:])
    loader = gpupipe.Loader(TarShards(path), batch_size=8, crop=crops.CenterCrop(16), shuffle=False, num_threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = torch.cat([y for _, y in loader])
    assert labels.tolist() == [7]


def test_a_shard_that_is_no_regular_file_or_claims_terabytes_fails_named_and_the_next_goes_on(tmp_path):
    """A FIFO as a shard waited in open() for a writer for good; a member whose PAX header claims
    10 TB made tarfile's stream read past the end block by block for good. Each is an unreadable
    shard now, named, and the next shard follows (in a child: the code before hung)."""
    [good] = write_tar_shards([("g0", 1, jpeg(10), "jpg")], tmp_path / "good", samples_per_shard=10)
    os.mkfifo(tmp_path / "fifo.tar")
    big = tmp_path / "big.tar"
    with tarfile.open(big, "w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("h0.jpg")
        data = jpeg(20)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    with tarfile.open(big, "w", format=tarfile.PAX_FORMAT) as t:  # h1's header claims 10 TB
        info = tarfile.TarInfo("h1.jpg")
        info.size = len(data)
        info.pax_headers = {"size": "10000000000000"}
        t.addfile(info, io.BytesIO(data))
    r = run_child(f"""
        from gpupipe.sources import TarShards
        shards = TarShards([{str(tmp_path / 'fifo.tar')!r}, {str(big)!r}, {str(good)!r}])
        for rec in shards.epoch_samples(epoch=0, seed=0, shuffle=False, rank=0, world_size=1, drop_last=False):
            print(repr((rec.key, rec.label, rec.error)))
    """, timeout=60)
    got = [eval(line) for line in r.stdout.splitlines()]
    assert "not a regular file" in got[0][2] and got[0][0].endswith("fifo.tar")
    assert "claims 10000000000000 bytes, past the shard's end" in got[1][2] and got[1][0].endswith("big.tar")
    assert got[2][:2] == (f"{good}:g0", 1) and got[2][2] is None and len(got) == 3


def test_a_member_name_twice_in_a_row_fails_its_sample_named(tmp_path):
    """d0.jpg, d0.cls, d0.jpg, d0.cls: the first image went out with the second label, the second
    image was lost, silently (WebDataset refuses a duplicate name)."""
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as t:
        for name, data in (("d0.jpg", jpeg(1)), ("d0.cls", b"0"), ("d0.jpg", jpeg(2)), ("d0.cls", b"7"),
                           ("d1.jpg", jpeg(3)), ("d1.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    got = records(TarShards(str(path)))
    assert [(r.key.rsplit(":", 1)[-1], r.label) for r in got] == [("d0", -1), ("d1", 1)]
    assert "'d0.jpg' comes twice in a row (a duplicate name)" in got[0].error and got[1].error is None


def test_shard_images_of_every_image_extension_and_labelled_keys_without_one_are_named(tmp_path):
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as t:
        for name, data in (("a.tiff", b"II*\0"), ("a.cls", b"1"), ("b.gif", b"GIF89a"), ("b.cls", b"2"),
                           ("c.left.jpg", jpeg(3)), ("c.cls", b"3"), ("d.json", b"{}"), ("d.cls", b"4"),
                           ("e.json", b"{}"), ("f.jpg", jpeg(6)), ("f.cls", b" 6\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    got = {r.key.rsplit(":", 1)[-1]: r for r in records(TarShards(str(path)))}  # a str: one shard, as WebDataset
    assert {k: (r.label, r.error is None) for k, r in got.items()} == \
        {"a": (1, True), "b": (2, True), "c": (3, True), "d": (-1, False), "f": (6, True)}
    assert "no image member for d" in got["d"].error  # e (metadata only, no label) is not a sample


def test_fewer_shards_than_ranks_is_an_error_on_every_rank(tmp_path):
    paths = write_tar_shards([(f"s{i}", i, jpeg(i), "jpg") for i in range(6)], tmp_path, samples_per_shard=2)
    shards = TarShards(paths, samples_per_rank=2)
    for rank in range(4):  # a rank without a shard would deliver nothing while the others wait for it
        with pytest.raises(ValueError, match="3 shards for 4 ranks"):
            records(shards, rank=rank, world_size=4)
    assert [len(records(shards, rank=r, world_size=3)) for r in range(3)] == [2, 2, 2]


# --- prepare ----------------------------------------------------------------------------------------


def test_prepare_follows_symlinked_class_folders_as_image_folder_does(tmp_path):
    tree(tmp_path, {"store/banana/0.jpg": jpeg(10), "store/banana/1.jpg": jpeg(20), "train/apple/0.jpg": jpeg(30),
                    "train/cherry/0.jpg": jpeg(40)})
    os.symlink(tmp_path / "store" / "banana", tmp_path / "train" / "banana")
    report = prepare(tmp_path / "train", tmp_path / "prepared", progress=False)
    assert report.failed == [] and report.files == 4
    before, after = ImageFolder(tmp_path / "train"), ImageFolder(tmp_path / "prepared")
    assert after.class_to_idx == before.class_to_idx and after.labels.tolist() == before.labels.tolist()


def test_prepare_checks_its_restart_arguments_and_names_compressed_shards_as_tars(tmp_path, capsys):
    tree(tmp_path, {"src/a/0.jpg": jpeg(1)})
    for rows, mcus in ((0, 0), (-1, 0), (70000, 8), (1, -1), (1, 70000), (1.5, 8)):
        with pytest.raises(ValueError, match="restart_(rows|mcus) must be an int"):
            prepare(tmp_path / "src", tmp_path / "out", restart_rows=rows, restart_mcus=mcus, progress=False)
    assert not (tmp_path / "out").exists()
    assert gpupipe.__main__.main(["prepare", str(tmp_path / "src"), str(tmp_path / "out"), "--restart-rows", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m gpupipe prepare: restart_rows must be") and "prepare: prepare:" not in err
    [plain] = write_tar_shards([("k", 1, jpeg(5), "jpg")], tmp_path / "shards", samples_per_shard=4)
    packed = tmp_path / "shards" / "s.tar.gz"
    with tarfile.open(plain) as tin, tarfile.open(packed, "w:gz") as tout:
        for m in tin:
            tout.addfile(m, tin.extractfile(m))
    report = prepare(packed, tmp_path / "prepared", progress=False)
    assert report.failed == [] and report.transcoded == 1
    out = tmp_path / "prepared" / "s.tar"  # a plain tar, named as one
    assert out.is_file() and not (tmp_path / "prepared" / "s.tar.gz").exists()
    assert [(r.label, r.error) for r in records(TarShards(out))] == [(1, None)]


def test_a_stream_state_records_its_shuffle_buffer_and_samples_per_rank(tmp_path):
    """Either orders the stream's samples: a state of other settings is refused (one without them,
    saved before they were recorded, is taken as this Loader's)."""
    paths = write_tar_shards([(f"s{i}", i, jpeg(i), "jpg") for i in range(8)], tmp_path, samples_per_shard=4)

    def loader(**kw):
        return gpupipe.Loader(TarShards(paths, **kw), batch_size=2, crop=crops.CenterCrop(16), num_threads=1)

    first = loader(shuffle_buffer=4)
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["stream"] == "shuffle_buffer=4, samples_per_rank=None"
    for other in (dict(shuffle_buffer=8), dict(shuffle_buffer=4, samples_per_rank=6)):
        with pytest.raises(ValueError, match="the state was taken with stream="):
            loader(**other).load_state_dict(state)
    del state["stream"]
    loader(shuffle_buffer=8).load_state_dict(state)
    it.close()


def test_decode_crop_dataset_refuses_a_streamed_source_at_once(tmp_path):
    paths = write_tar_shards([("s", 1, jpeg(1), "jpg")], tmp_path, samples_per_shard=4)
    with pytest.raises(TypeError, match="needs a map-style source .* got TarShards"):
        DecodeCropDataset(TarShards(paths), crops.CenterCrop(16))


def test_prepare_keeps_tar_owners_copies_an_empty_file_once_and_counts_what_it_copied(tmp_path, capsys):
    plain = tmp_path / "s.tar"
    with tarfile.open(plain, "w") as t:
        for i in range(5):
            for name, data in ((f"k{i}.jpg", jpeg(10 * i)), (f"k{i}.cls", b"%d" % i)):
                info = tarfile.TarInfo(name)
                info.size, info.uid, info.uname, info.gid, info.gname = len(data), 1001, "bob", 1002, "staff"
                t.addfile(info, io.BytesIO(data))
    assert gpupipe.__main__.main(["prepare", str(plain), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "copied unchanged (not a JPEG): 5: " in out and "(2 more)" in out and out.count("k3.cls") == 0
    with tarfile.open(tmp_path / "out" / "s.tar") as t:
        assert {(m.uid, m.uname, m.gid, m.gname) for m in t} == {(1001, "bob", 1002, "staff")}
    tree(tmp_path, {"src/a/empty.jpg": b"", "src/a/0.jpg": jpeg(1)})
    first = prepare(tmp_path / "src", tmp_path / "dst", progress=False)
    again = prepare(tmp_path / "src", tmp_path / "dst", progress=False)
    assert len(first.copied) == 1 and again.copied == [] and again.skipped_existing == 2


def test_prepare_counts_a_file_only_once_it_is_written(tmp_path):
    """A file that could not be written was counted transcoded (or copied) and failed."""
    tree(tmp_path, {"src/a/0.jpg": jpeg(1), "src/b/1.jpg": jpeg(2), "src/b/notes.txt": b"x"})
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "b").write_text("a file where the folder b goes")
    report = prepare(tmp_path / "src", tmp_path / "dst", progress=False)
    assert report.files == 3 and report.transcoded == 1 and report.copied == []
    assert sorted(os.path.basename(p) for p, _ in report.failed) == ["1.jpg", "notes.txt"]
    assert report.bytes_in == len(jpeg(1))
    [shard] = write_tar_shards([("k", 1, jpeg(5), "jpg")], tmp_path / "shards", samples_per_shard=4)
    blocked = tmp_path / "out" / os.path.basename(shard)
    blocked.mkdir(parents=True)  # the shard's output cannot be put in place
    os.utime(blocked, (0, 0))  # (older than the shard: not taken for its output)
    report = prepare(shard, tmp_path / "out", progress=False)
    assert report.files == 0 and report.transcoded == 0 and report.copied == [] and len(report.failed) == 1


@pytest.mark.parametrize("case", ["a file", "under a file"])
def test_prepare_checks_the_destination_once_before_it_starts(tmp_path, capsys, case):
    tree(tmp_path, {f"src/a/{i}.jpg": jpeg(i) for i in range(6)})
    (tmp_path / "afile").write_text("")
    dst = tmp_path / "afile" if case == "a file" else tmp_path / "afile" / "out"
    with pytest.raises(OSError, match="is a file, not a folder" if case == "a file" else "the destination .*: cannot create the folder"):
        prepare(tmp_path / "src", dst, progress=False)
    assert gpupipe.__main__.main(["prepare", str(tmp_path / "src"), str(dst)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("python -m gpupipe prepare: "), err


def test_prepare_says_what_is_wrong_with_a_source(tmp_path, capsys):
    tree(tmp_path, {"notes.txt": b"x", "one/a/0.jpg": jpeg(1), "two/a/0.jpg": jpeg(2)})
    main = gpupipe.__main__.main
    for args, said in (([tmp_path / "notes.txt"], "'" + str(tmp_path / "notes.txt") + "' is not a folder or a .tar shard"),
                       ([tmp_path / "one", tmp_path / "two"], f"'{tmp_path / 'one'}' is not a .tar shard"),
                       ([tmp_path / "none"], "does not exist")):
        assert main(["prepare", *map(str, args), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and said in err, err


def test_prepare_command_line_arguments(tmp_path, capsys):
    """--threads is checked before the progress bar starts (0: the default); a missing destination
    names dst, not a hidden argument; an empty source is an error (exit 1), not "0 files"."""
    tree(tmp_path, {"src/a/0.jpg": jpeg(1)})
    main = gpupipe.__main__.main
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "out"), "--threads", "-2"]) == 2
    assert capsys.readouterr().err == "python -m gpupipe prepare: num_threads must be within 0..1024 (0: the default), got -2\n"
    with pytest.raises(ValueError, match=r"num_threads must be within 0..1024 \(0: the default\)"):
        prepare(tmp_path / "src", tmp_path / "out", num_threads=-2, progress=False)
    assert main(["prepare", str(tmp_path / "src"), str(tmp_path / "out"), "--threads", "0"]) == 0
    assert "1 JPEGs transcoded" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["prepare", str(tmp_path / "src")])
    err = capsys.readouterr().err
    assert "the following arguments are required: dst\n" in err and "more" not in err
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    assert "(default, or 0: the default decode thread count)" in " ".join(capsys.readouterr().out.split())
    (tmp_path / "empty").mkdir()
    assert main(["prepare", str(tmp_path / "empty"), str(tmp_path / "out2")]) == 1
    out, err = capsys.readouterr()  # (after the progress bar's lines)
    assert out == "" and err.splitlines()[-1] == f"python -m gpupipe prepare: no files to prepare in {tmp_path / 'empty'}"
