"""Print the 1000 ImageNet class names in torchvision's order (no download: they ship with
torchvision's weight metadata). Used once to make pipeline/models/data/imagenet_classes.txt."""

import torchvision

print("# ImageNet-1k class names, index order, from torchvision.models.ResNet50_Weights metadata")
for name in torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"]:
    print(name)
