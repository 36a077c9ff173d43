"""Reliability, round 3: each report of the issue, reproduced (the wrong pixels of 4x2 / 2x4 samplings
are in test_resize.py, with every legal sampling). Cases that could take the process down run in a
child process that must exit 0 and print nothing to stderr."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import crafted
import gpupipe
from gpupipe import _C
from gpupipe.prepare import prepare_bytes
from helpers import encode, photo, run_child

# --- 2. header reads are linear in the number of segments -----------------------------------------

EMPTY_APP1 = b"\xff\xe1\x00\x02"


def test_header_read_is_linear_in_the_number_of_app_segments(jpeg):
    """libjpeg's jpeg_save_markers appended each segment by walking its list: 65,000 empty APP1s took
    6.4 s; read once per sample of a batch. Linear, the file takes about a millisecond."""
    data = crafted.with_app1s(jpeg, *([EMPTY_APP1] * 65000), crafted.exif_app1(6))
    t0 = time.perf_counter()
    info = gpupipe.read_header(data)
    assert info.orientation == 6  # the EXIF after the 65,000 segments is still found
    r = gpupipe.decode_crop_jpegs([data] * 4, [[0, 0, 8, 8]] * 4, num_threads=2)
    assert bool(r.ok.all())
    prepared = prepare_bytes(data)
    assert time.perf_counter() - t0 < 2.0  # ~10 ms; quadratic, 30 s
    assert prepared.count(EMPTY_APP1) == 65000  # the transcode keeps every APPn segment, in order
    assert gpupipe.read_header(prepared).orientation == 6


def test_exif_orientation_in_segments_libjpeg_also_reads(jpeg):
    """The segment walk reads what jpeg_read_header reads: fill bytes before a marker, an APP1 after
    the SOF, nothing after the first SOS."""
    exif = crafted.exif_app1(3)
    assert gpupipe.read_header(jpeg[:2] + b"\xff\xff\xff" + exif + jpeg[2:]).orientation == 3
    sof = jpeg.index(b"\xff\xc0")
    sof_end = sof + 2 + int.from_bytes(jpeg[sof + 2:sof + 4], "big")
    assert gpupipe.read_header(jpeg[:sof_end] + exif + jpeg[sof_end:]).orientation == 3
    sos = crafted.sos_offset(jpeg)
    assert gpupipe.read_header(jpeg[:-2] + exif + jpeg[-2:]).orientation == 1  # after SOS: not a header segment
    assert sos < len(jpeg) - 2


# --- 5. the interpreter exits while another thread is inside a gpupipe call -----------------------

@pytest.mark.parametrize("call", ["decode_crop_jpegs", "decode_crop_jpeg", "read_files", "loader"])
def test_exit_while_a_daemon_thread_decodes_never_aborts(call, tmp_path):
    """A daemon thread inside a gpupipe call when the interpreter exits aborted the process ("terminate
    called without an active exception"): its GIL request after finalization began ends the thread
    with a forced unwind through a noexcept destructor. Now exit waits for the call in hand and parks
    the thread at its end, before it returns to code that drops its tensors (torch ops, which abort
    the same way). Two exits each, at different points of the calls."""
    (tmp_path / "a").mkdir()
    data = encode(photo(600, 800))
    for i in range(32):
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    for delay in (0.0, 0.3):
        out = run_child(f"""
            import threading, time, numpy as np, gpupipe
            root = {str(tmp_path)!r}
            data = open(root + "/a/0.jpg", "rb").read()
            def work():
                while True:
                    if {call!r} == "decode_crop_jpegs":
                        gpupipe.decode_crop_jpegs([data] * 16, np.array([[0, 0, 600, 800]] * 16), size=224, num_threads=2)
                    elif {call!r} == "decode_crop_jpeg":
                        gpupipe.decode_crop_jpeg(data, 0, 0, 600, 800, size=224)
                    else:
                        gpupipe._C.read_files([(root + "/a/0.jpg").encode()] * 64, 2)
            if {call!r} == "loader":  # the training loop leaves without closing the Loader
                loader = gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=8, num_threads=2,
                                        crop=gpupipe.crops.RandomResizedCrop(224))
                for images, labels in loader:
                    break
            else:
                threading.Thread(target=work, daemon=True).start()
            time.sleep({delay})
            print("exiting")
            """)
        assert out.stdout.strip() == "exiting"


def test_a_forked_child_does_not_wait_for_the_parents_calls(jpeg):
    """The count of running calls belongs to the threads that made them: a child forked while another
    thread decodes exits at once."""
    out = run_child(f"""
        import os, threading, time, numpy as np, gpupipe
        from gpupipe import _C
        data = {jpeg!r}
        stop = False
        def work():
            while not stop:
                gpupipe.decode_crop_jpegs([data] * 64, np.array([[0, 0, 16, 16]] * 64), num_threads=2)
        t = threading.Thread(target=work)
        t.start()
        while _C._calls_running() == 0:
            time.sleep(0.001)
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 0 if _C._calls_running() == 0 else 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        stop = True
        t.join()
        print(os.waitstatus_to_exitcode(status), round(time.perf_counter() - t0))
        """)
    assert out.stdout.split() == ["0", "0"]
