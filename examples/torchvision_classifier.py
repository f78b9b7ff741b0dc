"""A torchvision classifier, checked for data-parallel parity on 32x32 images.

    python -m mgpu check examples/torchvision_classifier.py:mobilenet --input-shape 3,32,32 --classes 10

The functions return plain `nn.Module`s, so mgpu draws the batches itself from --input-shape
(uniform [0, 1) images) and --classes (uniform labels), with a summed cross-entropy.

Expected: every check passes, with two findings, the model's, not mgpu's:

* batch-mixing: the BatchNorm layers normalise over each device's shard, not the global batch,
  so N devices do not compute what one device computes on the whole batch; mgpu compares with one
  device run over the same shards, and says how far the two drift apart;
* random-layers: the classifier's dropout draws a different mask on each device; mgpu switches it
  off for the comparisons.

Sizes (parameters at 10 classes) and what else they hold:

    mobilenet   MobileNetV3-small   1.5M   BatchNorm, dropout, squeeze-excitation
    mnasnet     MNASNet 0.5         0.95M  BatchNorm, dropout (diverges with the check's SGD at lr 0.05)
    shufflenet  ShuffleNetV2 x0.5   0.35M  BatchNorm, no dropout
    resnet18    ResNet-18           11M    BatchNorm; slow on a CPU
"""

from torchvision import models


def mobilenet():
    return models.mobilenet_v3_small(num_classes=10)


def mnasnet():
    return models.mnasnet0_5(num_classes=10)


def shufflenet():
    return models.shufflenet_v2_x0_5(num_classes=10)


def resnet18():
    return models.resnet18(num_classes=10)
