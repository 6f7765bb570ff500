"""A data-parallel convnet training script, written as a user would for CPU DDP under torchrun:
torchvision's resnet18 on a synthetic image dataset (no download), a DistributedSampler,
SGD with momentum, gloo. Used by ``bench_scale_script.py`` (``profilednn scale -- python ...``).

    torchrun --nproc-per-node 2 benchmarks/scripts/ddp_convnet_train.py --batch-size 16
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0

    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.samples, 3, args.image_size, args.image_size, generator=g)
    labels = torch.randint(0, 10, (args.samples,), generator=g)
    data = TensorDataset(images, labels)
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None, drop_last=True)

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        start = time.perf_counter()
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
