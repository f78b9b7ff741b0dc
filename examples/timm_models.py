"""timm's vision models, built from configs at 32x32 (random weights, no download), checked for
data-parallel parity.

    python -m mgpu check examples/timm_models.py:vit --input-shape 3,32,32 --classes 10
    python -m mgpu check examples/timm_models.py:convnext --input-shape 3,32,32 --classes 10
    python -m mgpu check examples/timm_models.py:efficientnet --input-shape 3,32,32 --classes 10
    python -m mgpu check examples/timm_models.py:resnet --input-shape 3,32,32 --classes 10

Needs `pip install 'mgpu[models]'` (timm). Each function returns a plain `nn.Module`, so mgpu draws
uniform images and labels itself from --input-shape and --classes.

Expected: every check passes and none is skipped. Findings: random-layers where the model has
dropout (ViT's attention passes its probability to `scaled_dot_product_attention`; EfficientNet's
head calls `F.dropout` itself), batch-mixing for the models with BatchNorm (EfficientNet, ResNet):
each device normalises over its shard.

    function      timm model            parameters (10 classes)  what it holds
    vit           vit_tiny_patch16_224  5.4M at depth 12          attention with dropout_p; here depth 2, patch 8
    convnext      convnext_atto         3.4M                      LayerNorm, depthwise convolutions, layer scale
    efficientnet  efficientnet_b0       4.0M                      BatchNorm, squeeze-excitation, F.dropout in the head
    resnet        resnet10t             4.9M                      BatchNorm
    vit_tiny      vit_tiny_patch16_224  5.4M                      the whole ViT-tiny (depth 12, patch 4): the size CI wants checked in 2 minutes
"""

import timm


def vit():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=10, drop_rate=0.1, attn_drop_rate=0.1, proj_drop_rate=0.1)


def vit_tiny():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, num_classes=10,
                             attn_drop_rate=0.1)


def convnext():
    return timm.create_model("convnext_atto", pretrained=False, num_classes=10)


def efficientnet():
    return timm.create_model("efficientnet_b0", pretrained=False, num_classes=10, drop_rate=0.2)


def resnet():
    return timm.create_model("resnet10t", pretrained=False, num_classes=10)
