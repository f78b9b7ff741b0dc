"""Fashion-MNIST through torchvision, an offline synthetic stand-in, and the batch order that
every strategy shares.

    >>> train_loader, test_loader = load_fashion_mnist(256, root="data")        # needs the files
    >>> train_loader, test_loader = synthetic_fashion_mnist(256, seed=0)        # needs nothing

Both return `BatchLoader`s over an in-memory `ImageDataset`. A loader shuffles once per epoch over
the whole dataset (seeded by seed and epoch) and yields *global* batches; a multi-device strategy
then takes contiguous parts of each global batch. So every strategy and every device count sees
the same examples in the same steps, which `DistributedSampler` (interleaving ranks) would not give.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch.nn import functional as F

from mgpu.errors import ConfigError, DataError, DataNotFoundError

__all__ = ["ImageDataset", "BatchLoader", "load_fashion_mnist", "synthetic_fashion_mnist",
           "FASHION_MNIST_CLASSES", "FASHION_MNIST_FILES"]

FASHION_MNIST_CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat",
                         "sandal", "shirt", "sneaker", "bag", "ankle boot")
FASHION_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass
class ImageDataset:
    """Images and labels held in memory; `take` turns a batch of indices into model input."""

    images: torch.Tensor  # (N, H, W) uint8 in 0..255, or (N, C, H, W) float in [0, 1]
    labels: torch.Tensor  # (N,) int64 in 0..num_classes-1
    resize: int | None = None  # square side to resize to in `take`, None keeps the stored size

    def __post_init__(self):
        if self.images.shape[0] != self.labels.shape[0]:
            raise DataError(f"{self.images.shape[0]} images but {self.labels.shape[0]} labels")

    def __len__(self) -> int:
        return self.labels.shape[0]

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, y) for these indices: X is (B, C, H, W) float32 in [0, 1], y is (B,) int64."""
        x = self.images[indices]
        if x.dtype == torch.uint8:
            x = x.unsqueeze(1).float().div_(255)  # (B, 1, H, W)
        if self.resize is not None and x.shape[-1] != self.resize:
            x = F.interpolate(x, size=(self.resize, self.resize), mode="bilinear", antialias=True,
                              align_corners=False).clamp_(0, 1)
        return x, self.labels[indices]

    def head(self, n: int | None) -> "ImageDataset":
        """The first n examples (all of them when n is None)."""
        if n is None:
            return self
        if n < 1:
            raise ConfigError(f"a dataset size cap must be at least 1, got {n}")
        return ImageDataset(self.images[:n], self.labels[:n], self.resize)


class BatchLoader:
    """Global batches over an ImageDataset, reshuffled each epoch from (seed, epoch).

    drop_last drops a final batch smaller than batch_size (training does, so that every step of
    every strategy sees exactly batch_size examples); evaluation keeps every example.
    """

    def __init__(self, dataset: ImageDataset, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
        if len(dataset) == 0:
            raise DataError("the dataset is empty")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n, b = len(self.dataset), self.batch_size
        return n // b if self.drop_last else math.ceil(n / b)

    def index_batches(self) -> Iterator[torch.Tensor]:
        """Global batches of dataset indices for the current epoch."""
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        for i in range(len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.index_batches():
            yield self.dataset.take(idx)


def _read_idx(path: Path, expected_magic: int) -> torch.Tensor:
    """An IDX file (gzip or raw) as a uint8 tensor; DataError when it is not one."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if len(raw) < 8 or int.from_bytes(raw[:4], "big") != expected_magic:
        raise DataError(f"{path} is not an IDX file of the expected kind (magic number {expected_magic})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    if len(raw) - offset != math.prod(dims):
        raise DataError(f"{path} is truncated or corrupt: header says {dims}, "
                        f"payload has {len(raw) - offset} bytes")
    if math.prod(dims) == 0:
        return torch.zeros(dims, dtype=torch.uint8)  # frombuffer refuses an empty buffer
    return torch.frombuffer(bytearray(raw[offset:]), dtype=torch.uint8).reshape(dims)


def _find_raw_file(raw_dir: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (raw_dir / name).is_file():
            return raw_dir / name
    return None


def _load_split(raw_dir: Path, prefix: str) -> ImageDataset:
    images = _read_idx(_find_raw_file(raw_dir, f"{prefix}-images-idx3-ubyte"), 2051)
    labels = _read_idx(_find_raw_file(raw_dir, f"{prefix}-labels-idx1-ubyte"), 2049).long()
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise DataError(f"{raw_dir}: {prefix} images {tuple(images.shape)} and labels {tuple(labels.shape)} do not match")
    if labels.numel() and int(labels.max()) > 9:
        raise DataError(f"{raw_dir}: {prefix} labels go up to {int(labels.max())}, Fashion-MNIST has 10 classes")
    return ImageDataset(images, labels)


def load_fashion_mnist(batch_size: int, root: str | Path = "data", download: bool = False,
                       resize: int | None = None, seed: int = 0) -> tuple[BatchLoader, BatchLoader]:
    """Train and test loaders for Fashion-MNIST in torchvision's layout: ROOT/FashionMNIST/raw/.

    With download=False and the files missing, raises DataNotFoundError naming the folder.
    The IDX files are read directly (gzip or not), so a corrupt or truncated file is a DataError
    rather than a decoding traceback.
    """
    root = Path(root)
    raw_dir = root / "FashionMNIST" / "raw"
    missing = [s for s in FASHION_MNIST_FILES if _find_raw_file(raw_dir, s) is None]
    if missing and download:
        import torchvision  # imported here: only downloading needs it

        for train in (True, False):
            try:
                torchvision.datasets.FashionMNIST(str(root), train=train, download=True)
            except Exception as e:  # network errors come in many types; all mean the same here
                raise DataNotFoundError(f"downloading Fashion-MNIST into {raw_dir} failed: {e}") from None
        missing = [s for s in FASHION_MNIST_FILES if _find_raw_file(raw_dir, s) is None]
    if missing:
        raise DataNotFoundError(
            f"Fashion-MNIST not found in {raw_dir} (missing {', '.join(m + '[.gz]' for m in missing)}); "
            "pass --download (download=True) to fetch it, or use the synthetic data")
    if resize is not None and (not isinstance(resize, int) or resize < 1):
        raise ConfigError(f"resize must be a positive integer, got {resize!r}")
    train, test = _load_split(raw_dir, "train"), _load_split(raw_dir, "t10k")
    train.resize = test.resize = resize
    return (BatchLoader(train, batch_size, shuffle=True, seed=seed, drop_last=True),
            BatchLoader(test, batch_size, shuffle=False))


def _draw_examples(templates: torch.Tensor, n: int, g: torch.Generator) -> ImageDataset:
    """n noisy examples of the class templates: each shifted by up to 3 pixels, its contrast
    scaled, Gaussian noise added; 3 % of labels are redrawn at random, so accuracy tops out near 0.97."""
    k, _, s, _ = templates.shape
    labels = torch.randint(0, k, (n,), generator=g)
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    x = templates[labels]  # (N, 1, S, S)
    # Roll each image by its own shift: group by shift value so it stays vectorised.
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            sel = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            if sel.any():
                x[sel] = torch.roll(x[sel], shifts=(dy, dx), dims=(2, 3))
    contrast = 0.5 + 0.5 * torch.rand(n, 1, 1, 1, generator=g)
    x = (x * contrast + 0.2 * torch.randn(x.shape, generator=g)).clamp_(0, 1)
    flip = torch.rand(n, generator=g) < 0.03
    labels[flip] = torch.randint(0, k, (int(flip.sum()),), generator=g)
    return ImageDataset(x.contiguous(), labels)


def synthetic_fashion_mnist(batch_size: int, train_size: int = 60_000, test_size: int = 10_000,
                            seed: int = 0, resize: int | None = None) -> tuple[BatchLoader, BatchLoader]:
    """Offline stand-in for `load_fashion_mnist`: same shapes, dtypes and class count, seeded.

    Same arguments give bitwise the same data. The batch order seed is `seed` too.
    """
    for name, value in (("train_size", train_size), ("test_size", test_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    g = torch.Generator().manual_seed(seed)
    coarse = (torch.rand(10, 1, 7, 7, generator=g) > 0.5).float()
    templates = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    train = _draw_examples(templates, train_size, g)
    test = _draw_examples(templates, test_size, g)
    train.resize = test.resize = resize
    return (BatchLoader(train, batch_size, shuffle=True, seed=seed, drop_last=True),
            BatchLoader(test, batch_size, shuffle=False))
