"""Run by test_loader.py under `torchrun --nproc_per_node=2`: each rank iterates two epochs of a
Loader over an identity-encoded ImageFolder and rank 0 writes what every rank saw."""

import json
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import gpupipe  # noqa: E402
from loader_data import index_of  # noqa: E402


def main(root: str, out: str) -> None:
    dist.init_process_group("gloo")
    loader = gpupipe.Loader(gpupipe.sources.ImageFolder(root), batch_size=7, crop=gpupipe.crops.CenterCrop(32),
                            num_threads=1, seed=5)
    seen = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        mine = [index_of(img) for images, _ in loader for img in images]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        seen[epoch] = gathered
    info = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "len": len(loader)}
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"seen": seen, "info": info}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
