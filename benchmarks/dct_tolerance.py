"""DCT-scaled decode against the exact resample, on content where they differ most: skimage's grass
and gravel (fine texture, native 512x512, q90) through RandomResizedCrop's resize of the whole
image, and 16 photos (520-1100 px, upscaled) through ResizeCenterCrop(224, 256). The numbers
docs/semantics.md states. Usage: python -m benchmarks.dct_tolerance"""

from __future__ import annotations

import io

import numpy as np
import torch


def _jpeg(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _chw(img) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).int()


def main() -> None:
    import skimage.data as sd
    import torchvision.transforms.v2.functional as F
    from PIL import Image
    from torchvision.transforms import v2

    import gpupipe
    from gpupipe import crops

    torch.set_num_threads(1)
    for name in ("grass", "gravel"):
        gray = getattr(sd, name)()
        data = _jpeg(Image.fromarray(np.stack([gray] * 3, -1)))
        full = Image.open(io.BytesIO(data)).convert("RGB")
        box = [0, 0, gray.shape[0], gray.shape[1]]
        for size in (224, 112):
            scaled = gpupipe.decode_crop_jpegs([data], [box], size=(size, size)).images[0]
            ref = _chw(F.resized_crop(full, *box, [size, size], antialias=True))
            print(f"RandomResizedCrop's resize, {name} {box[2]}x{box[3]} -> {size}: mean |DCT-scaled - exact| "
                  f"{(scaled.int() - ref).abs().float().mean():.2f} levels")
    rng = np.random.default_rng(5)
    sampler = crops.ResizeCenterCrop(224, 256, dct_scaling=True)
    tv = v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])
    means = []
    for i in range(16):
        w, h = int(rng.integers(520, 1100)), int(rng.integers(520, 1100))
        photo = getattr(sd, ["astronaut", "coffee", "chelsea", "rocket"][i % 4])()
        data = _jpeg(Image.fromarray(photo).resize((w, h), Image.BICUBIC))
        out = gpupipe.decode_crop_jpegs([data], sampler.boxes([h], [w]), size=sampler.size, window=True,
                                        dct_scaling=True).images[0]
        means.append(float((out.int() - _chw(tv(Image.open(io.BytesIO(data)).convert("RGB")))).abs().float().mean()))
    print(f"ResizeCenterCrop(224, 256, dct_scaling=True), 16 photos of 520-1100 px: mean {np.mean(means):.2f} levels, "
          f"{max(means):.2f} on the worst")


if __name__ == "__main__":
    main()
