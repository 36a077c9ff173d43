#!/usr/bin/env bash
# Idempotent set-up shared by the README's commands: system libjpeg-turbo headers, a venv in .venv
# with torch/torchvision from this machine's wheels, the peers, and gpupipe built in place.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[setup] $*" >&2; }

if [ ! -f /usr/include/jpeglib.h ] && [ ! -f /usr/local/include/jpeglib.h ]; then
  log "installing libjpeg-turbo development files (apt)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libjpeg62-turbo-dev || $SUDO apt-get install -y -qq libjpeg-turbo8-dev
fi
command -v cmake >/dev/null || { log "cmake missing: apt-get install cmake"; exit 1; }

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
pip_q() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$VPY" -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1') and torchvision.__version__.startswith('0.29.1')" 2>/dev/null; then
  log "installing torch==2.14.1 torchvision==0.29.1"
  pip_q torch==2.14.1 torchvision==0.29.1
fi
if ! "$VPY" -c "import pybind11, scikit_build_core, pytest, PIL, skimage, simplejpeg, kornia, matplotlib, tqdm, packaging, ninja" 2>/dev/null; then
  log "installing build, test and benchmark packages"
  pip_q "pybind11>=2.12" "scikit-build-core>=0.8" ninja pytest "pillow>=13" scikit-image simplejpeg kornia matplotlib tqdm packaging numpy
fi
if ! "$VPY" -c "import atheris" 2>/dev/null; then
  log "installing atheris (the Python API fuzz smoke)"
  pip_q atheris || log "atheris could not be installed: the API fuzz smoke will be skipped"
fi
if ! "$VPY" -c "import nvidia.dali" 2>/dev/null; then
  log "installing nvidia-dali-cuda120 (optional peer/backend; its CPU pipelines run without a GPU)"
  pip_q nvidia-dali-cuda120 || log "DALI could not be installed: its tests and benchmark rows will be skipped"
fi
if ! "$VPY" -c "import importlib.util as u; assert u.find_spec('nvidia.nvimgcodec')" 2>/dev/null; then
  log "installing nvidia-nvimgcodec-cu13 0.9 (optional: the GPU engines; its header builds their C-API path, its CPU decoder tests that path here)"
  pip_q "nvidia-nvimgcodec-cu13==0.9.*" || log "nvImageCodec could not be installed: its C-API tests will be skipped"
fi

# SPDL (an optional benchmark peer) decodes through FFmpeg's shared libraries.
if "$VPY" -c "import spdl" 2>/dev/null || pip_q spdl 2>/dev/null; then
  if ! ldconfig -p | grep -q libavcodec; then
    log "installing FFmpeg runtime libraries for SPDL (optional peer)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends libavutil57 libavcodec59 \
      libavformat59 libavfilter8 libavdevice59 libswscale6 libswresample4) >/dev/null 2>&1 \
      || log "FFmpeg libraries unavailable: SPDL rows will be skipped"
  fi
fi

# clang with libFuzzer + sanitizer runtimes, for the fuzz smoke in the test suite (best effort).
if ! command -v clang++ >/dev/null && ! command -v clang++-14 >/dev/null; then
  log "installing clang-14 (libFuzzer, ASan, UBSan) for the fuzz smoke"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev) \
    >/dev/null 2>&1 || log "clang unavailable: the fuzz smoke will be skipped"
fi

# The distribution was named "gpupipe" before it became torch-gpupipe: one editable install only.
if "$VPY" -m pip show -q gpupipe >/dev/null 2>&1; then
  log "removing the old gpupipe distribution (now torch-gpupipe)"
  "$VPY" -m pip uninstall -q -y gpupipe
fi
log "building gpupipe (editable)"
pip_q --no-build-isolation -e .
"$VPY" -c "import gpupipe; print('[setup] gpupipe', gpupipe.__version__, 'with libjpeg-turbo', gpupipe._C.libjpeg_turbo_version)" >&2
