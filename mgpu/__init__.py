"""mgpu: data-parallel training in PyTorch, checked against single-device training.

    python -m mgpu train --strategy manual --devices 2 --model lenet --epochs 2
"""

__version__ = "0.1.0"
