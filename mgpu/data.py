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

import contextlib
import gzip
import math
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch.nn import functional as F

from mgpu.devices import check_fits, to_device
from mgpu.errors import ConfigError, DataError, DataNotFoundError
from mgpu.errors import one_line as _one_line
from mgpu.validators import positive_int

__all__ = ["ImageDataset", "BatchLoader", "load_fashion_mnist", "synthetic_fashion_mnist", "FASHION_MNIST_FILES",
           "make_loaders", "dataset_bytes", "check_data_fits"]

# The files torchvision's FashionMNIST reads from ROOT/FashionMNIST/raw/ (each may also be there as NAME.gz only).
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
        if indices.device != self.images.device:  # the batch order is drawn on the host, the data may be on a GPU
            indices = to_device(indices, self.images.device)
        x = self.images[indices]
        if x.dtype == torch.uint8:
            x = x.unsqueeze(1).float().div_(255)  # (B, 1, H, W)
        if self.resize is not None and x.shape[-1] != self.resize:
            x = F.interpolate(x, size=(self.resize, self.resize), mode="bilinear", antialias=True,
                              align_corners=False).clamp_(0, 1)
        return x, self.labels[indices]

    @property
    def nbytes(self) -> int:
        return self.images.element_size() * self.images.numel() + self.labels.element_size() * self.labels.numel()

    def to(self, device) -> "ImageDataset":
        """The dataset held on `device` (--data-on-device): `take` then gathers batches there."""
        return ImageDataset(self.images.to(device), self.labels.to(device), self.resize)

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
    every strategy sees exactly batch_size examples); evaluation keeps every example. batch_size is
    taken as given: the functions that make loaders from a caller's numbers check it (a run's,
    `make_loaders`, gets it checked by TrainConfig.validate).
    """

    def __init__(self, dataset: ImageDataset, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False):
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


def _raw_file(raw_dir: Path, name: str) -> Path | None:
    """raw_dir/name, or else raw_dir/name.gz, whichever is a file; None if neither is."""
    for path in (raw_dir / name, raw_dir / f"{name}.gz"):
        if path.is_file():
            return path
    return None


def _missing(raw_dir: Path) -> list[str]:
    return [name for name in FASHION_MNIST_FILES if _raw_file(raw_dir, name) is None]


@contextlib.contextmanager
def _torchvision_root(root: Path, raw_dir: Path) -> Iterator[tuple[Path, dict[str, Path]]]:
    """(a root torchvision's FashionMNIST can read, the user's path of each file for messages).

    torchvision reads the unpacked files only. When some are there as .gz only, they are unpacked
    into a temporary root, the unpacked ones linked beside them: the user's folder stays as it is
    (it may be read-only or shared), and a corrupt .gz is reported here, naming it.
    """
    sources = {name: _raw_file(raw_dir, name) for name in FASHION_MNIST_FILES}
    if not any(path.name.endswith(".gz") for path in sources.values()):
        yield root, sources
        return
    from torchvision.datasets.utils import extract_archive

    with tempfile.TemporaryDirectory(prefix="mgpu-fashion-mnist-") as tmp:
        unpacked = Path(tmp) / "FashionMNIST" / "raw"
        unpacked.mkdir(parents=True)
        for name, source in sources.items():
            if not source.name.endswith(".gz"):
                _link_or_copy(source, unpacked / name)
                continue
            try:
                extract_archive(source, unpacked)  # gunzips NAME.gz into unpacked/NAME
            except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                raise DataError(f"{source} is truncated or corrupt: it does not gunzip ({_one_line(e)})") from None
            except OSError as e:  # unreadable, or no room in the temporary folder
                raise DataError(f"cannot unpack {source}: {_one_line(e)}") from None
        yield Path(tmp), sources


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        target.symlink_to(source.resolve())
    except OSError:  # no symlinks here (e.g. Windows without the privilege)
        shutil.copyfile(source, target)


def _idx_problem(path: Path, ndim: int) -> str | None:
    """What is wrong with an IDX file of uint8 data and `ndim` dimensions that torchvision could
    not read, in words; None when its header and size look right. Reads the header only."""
    magic = 0x800 + ndim  # type code 8 (uint8), then the dimension count: 2051 images, 2049 labels
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4 + 4 * ndim)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if size == 0:
        return "is an empty file (0 bytes), not an IDX file"
    if len(head) < 4 or int.from_bytes(head[:4], "big") != magic:
        return f"is not an IDX file of the expected kind (magic number {magic})"
    if len(head) < 4 + 4 * ndim:
        return f"is truncated or corrupt: its header is cut short ({size} bytes)"
    dims = [int.from_bytes(head[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    if dims[0] == 0:
        return "holds no examples: the dataset is empty"
    if size - len(head) != math.prod(dims):
        return f"is truncated or corrupt: header says {dims}, payload has {size - len(head)} bytes"
    return None


def _load_split(tv_root: Path, sources: dict[str, Path], train: bool) -> ImageDataset:
    """One split through torchvision.datasets.FashionMNIST; DataError naming the file if it fails."""
    from torchvision.datasets import FashionMNIST

    prefix = "train" if train else "t10k"
    images_name, labels_name = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
    try:
        split = FashionMNIST(str(tv_root), train=train)
    except Exception as e:  # torchvision says little (an AssertionError, int() of b'', ...): find the file and why
        unpacked = tv_root / "FashionMNIST" / "raw"
        for name, ndim in ((images_name, 3), (labels_name, 1)):
            problem = _idx_problem(unpacked / name, ndim)
            if problem:
                raise DataError(f"{sources[name]} {problem}") from None
        raise DataError(f"cannot read {sources[images_name]} and {sources[labels_name]}: "
                        f"{type(e).__name__}: {_one_line(e)}") from None
    images, labels = split.data, split.targets  # (N, 28, 28) uint8, (N,) int64
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{sources[images_name]} holds {images.shape[0]} images but {sources[labels_name]} "
                        f"holds {labels.shape[0]} labels")
    if labels.numel() and int(labels.max()) > 9:
        raise DataError(f"{sources[labels_name]}: labels go up to {int(labels.max())}, Fashion-MNIST has 10 classes")
    return ImageDataset(images, labels)


def _download(root: Path, raw_dir: Path) -> None:
    from torchvision.datasets import FashionMNIST

    try:
        FashionMNIST(str(root), train=True, download=True)  # fetches and unpacks all four files
    except Exception as e:  # network errors come in many types; all mean the same here
        if _missing(raw_dir):
            raise DataNotFoundError(f"downloading Fashion-MNIST into {raw_dir} failed: {_one_line(e)}") from None
        # The files came but do not read: loading them says which and why.


def load_fashion_mnist(batch_size: int, root: str | Path = "data", download: bool = False,
                       resize: int | None = None, seed: int = 0) -> tuple[BatchLoader, BatchLoader]:
    """Train and test loaders for Fashion-MNIST in torchvision's layout: ROOT/FashionMNIST/raw/.

    The files are read by torchvision.datasets.FashionMNIST; each may also be there gzipped only
    (NAME.gz, as downloaded). With download=False and files missing, raises DataNotFoundError
    naming the folder; a corrupt, truncated, empty or mismatched file is a DataError naming it.
    """
    positive_int(batch_size, "batch size")
    if resize is not None:
        positive_int(resize, "resize")
    train, test = _fashion_mnist_splits(Path(root), download)
    return _loaders(train, test, batch_size, seed, resize)


def _fashion_mnist_splits(root: Path, download: bool) -> tuple[ImageDataset, ImageDataset]:
    """(train, test) read from root/FashionMNIST/raw/ (fetched first when download and missing)."""
    raw_dir = root / "FashionMNIST" / "raw"
    if download and _missing(raw_dir):
        _download(root, raw_dir)
    missing = _missing(raw_dir)
    if missing:
        raise DataNotFoundError(
            f"Fashion-MNIST not found in {raw_dir} (missing {', '.join(m + '[.gz]' for m in missing)}); "
            "pass --download (download=True) to fetch it, or use the synthetic data")
    with _torchvision_root(root, raw_dir) as (tv_root, sources):
        return _load_split(tv_root, sources, train=True), _load_split(tv_root, sources, train=False)


def _loaders(train: ImageDataset, test: ImageDataset, batch_size: int, seed: int,
             resize: int | None) -> tuple[BatchLoader, BatchLoader]:
    """The training loader (shuffled, full batches only) and the test loader (in order, every example)."""
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
    for name, value in (("train_size", train_size), ("test_size", test_size), ("batch size", batch_size)):
        positive_int(value, name)
    train, test = _synthetic_splits(train_size, test_size, seed)
    return _loaders(train, test, batch_size, seed, resize)


def _synthetic_splits(train_size: int, test_size: int, seed: int) -> tuple[ImageDataset, ImageDataset]:
    """(train, test) drawn from ten seeded class templates: coarse 7x7 blobs smoothed to 28x28."""
    g = torch.Generator().manual_seed(seed)
    coarse = (torch.rand(10, 1, 7, 7, generator=g) > 0.5).float()
    templates = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    return _draw_examples(templates, train_size, g), _draw_examples(templates, test_size, g)


# -- what a run needs of its data ----------------------------------------------------------------

def make_loaders(cfg) -> tuple[BatchLoader, BatchLoader]:
    """Train and test loaders for a validated TrainConfig: its data, sizes, batch size, resize and seed.

    Its values are taken as TrainConfig.validate left them (`python -m mgpu train` reads its data
    through here once before any rank starts, and once in each process), so none is checked again.
    """
    if cfg.data == "synthetic":
        train, test = _synthetic_splits(cfg.train_size or 60_000, cfg.test_size or 10_000, cfg.seed)
        return _loaders(train, test, cfg.batch_size, cfg.seed, cfg.resize)
    train, test = _fashion_mnist_splits(Path(cfg.data_dir), cfg.download)
    train_loader, test_loader = _loaders(train.head(cfg.train_size), test.head(cfg.test_size), cfg.batch_size,
                                         cfg.seed, cfg.resize)
    if len(train_loader) == 0:
        raise ConfigError(f"{len(train_loader.dataset)} training examples do not fill one global batch "
                          f"of {cfg.batch_size}")
    return train_loader, test_loader


def dataset_bytes(loaders) -> int:
    """Bytes the loaders' datasets hold: what --data-on-device puts on a device."""
    return sum(loader.dataset.nbytes for loader in loaders)


def check_data_fits(loaders, devices) -> None:
    """--data-on-device: DeviceError unless every dataset fits in each CUDA device's free memory
    (no-op for CPU devices, where the data already is)."""
    nbytes = dataset_bytes(loaders)
    for device in devices:
        check_fits(nbytes, device)
