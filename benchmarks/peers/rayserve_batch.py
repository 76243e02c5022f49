"""The usual Ray Serve app, the peer Ferry is measured against.

One deployment, as the Ray Serve docs teach it: the HTTP request is read in the replica,
decoded and resized with PIL and torchvision transforms, batched with
``@serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)``, and run through
torchvision's ResNet-50 in fp16, channels_last, on the GPU. ``replicas`` replicas share one
GPU (``num_gpus = 1 / replicas``); ``max_ongoing_requests`` is 64 so batches can fill
(Serve's default of 5 would cap them at 5).

    import_path: benchmarks.peers.rayserve_batch:build_app   args: {replicas: 4}
"""

from __future__ import annotations

import io
from typing import Any

from ray import serve
from starlette.requests import Request


@serve.deployment
class ImageClassifier:
    def __init__(self) -> None:
        import torch
        import torchvision
        from torchvision import transforms

        self.torch = torch
        self.model = (
            torchvision.models.resnet50(weights=None)
            .eval()
            .half()
            .cuda()
            .to(memory_format=torch.channels_last)
        )
        self.transform = transforms.Compose(
            [
                transforms.Resize(256),
                transforms.CenterCrop(224),
                transforms.ToTensor(),
                transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            ]
        )
        self.labels = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"]
        with torch.no_grad():  # warm cuDNN for the batch sizes that will come
            for b in (1, 8, 64):
                self.model(
                    torch.zeros(b, 3, 224, 224, device="cuda", dtype=torch.float16).to(
                        memory_format=torch.channels_last
                    )
                )

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def classify(self, images: list[Any]) -> list[dict[str, Any]]:
        torch = self.torch
        x = (
            torch.stack([self.transform(img) for img in images])
            .half()
            .cuda()
            .to(memory_format=torch.channels_last)
        )
        with torch.no_grad():
            probs = self.model(x).float().softmax(dim=1)
        vals, idx = probs.topk(5, dim=1)
        vals, idx = vals.cpu().tolist(), idx.cpu().tolist()
        return [
            {
                "top_k": [
                    {"label": self.labels[i], "class": i, "score": v}
                    for v, i in zip(vs, ix, strict=True)
                ]
            }
            for vs, ix in zip(vals, idx, strict=True)
        ]

    async def __call__(self, request: Request) -> dict[str, Any]:
        from PIL import Image

        body = await request.body()
        img = Image.open(io.BytesIO(body)).convert("RGB")
        return await self.classify(img)


def build_app(args: dict[str, Any]) -> serve.Application:
    replicas = int(args.get("replicas", 1))
    return ImageClassifier.options(
        num_replicas=replicas,
        max_ongoing_requests=64,
        ray_actor_options={"num_gpus": 1.0 / replicas, "num_cpus": 1},
    ).bind()
