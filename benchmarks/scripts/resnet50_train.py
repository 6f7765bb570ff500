"""The built-in ``resnet50`` workload as a plain training script (what a user would write):
torchvision ResNet-50 from random weights, synthetic ImageNet-shaped batches, cross entropy,
SGD (momentum 0.9, weight decay 1e-4, lr 0.1 scaled to the batch). Nothing ProfileDNN-specific:
``bench_optimize_script.py`` optimizes it through ``profilednn optimize -- python``.

    python benchmarks/scripts/resnet50_train.py --batch-size 16 --image-size 224 --steps 100
"""

import argparse
import time

import torch
import torchvision
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(args.seed)
model = torchvision.models.resnet50(weights=None, num_classes=1000)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * args.batch_size / 256, momentum=0.9, weight_decay=1e-4)
loss_fn = nn.CrossEntropyLoss()
generator = torch.Generator().manual_seed(args.seed)
pool = [(torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator),
         torch.randint(0, 1000, (args.batch_size,), generator=generator)) for _ in range(4)]

model.train()
for step in range(args.steps):
    t0 = time.perf_counter()
    images, labels = pool[step % len(pool)]
    optimizer.zero_grad()
    loss = loss_fn(model(images), labels)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f} {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
