"""Fashion-MNIST from real-format IDX files, the synthetic stand-in, and the shared batch order."""

import gzip
import struct

import pytest
import torch

from mgpu.data import BatchLoader, ImageDataset, load_fashion_mnist, synthetic_fashion_mnist
from mgpu.errors import ConfigError, DataError, DataNotFoundError


def write_idx(path, array: torch.Tensor, compress: bool = True) -> None:
    """An IDX file as the official Fashion-MNIST ones are: big-endian header, uint8 payload."""
    magic = 2051 if array.ndim == 3 else 2049
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.to(torch.uint8).numpy().tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


@pytest.fixture
def fashion_root(tmp_path):
    """A torchvision-layout folder with 12 train and 5 test images of known content."""
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    data = {}
    for prefix, n in (("train", 12), ("t10k", 5)):
        images = torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8)
        labels = torch.randint(0, 10, (n,), generator=g, dtype=torch.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, compress=prefix == "train")
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, compress=prefix == "train")
        data[prefix] = images, labels
    return tmp_path, data


def test_load_fashion_mnist_reads_official_format_files(fashion_root):
    root, data = fashion_root
    train, test = load_fashion_mnist(4, root=root)
    X, y = test.dataset.take(torch.arange(5))
    assert X.shape == (5, 1, 28, 28) and X.dtype == torch.float32 and y.dtype == torch.int64
    torch.testing.assert_close(X[:, 0], data["t10k"][0].float() / 255, msg="test images changed on loading")
    assert torch.equal(y, data["t10k"][1].long()), "test labels changed on loading"
    assert len(train) == 3 and len(test) == 2, "train drops the last partial batch, test keeps it"
    seen = torch.cat([yb for _, yb in test])
    assert torch.equal(seen, data["t10k"][1].long()), "test loader must yield every example in order"


def test_load_fashion_mnist_resizes(fashion_root):
    root, _ = fashion_root
    _, test = load_fashion_mnist(5, root=root, resize=96)
    X, _ = next(iter(test))
    assert X.shape == (5, 1, 96, 96) and 0 <= X.min() and X.max() <= 1


def test_missing_files_name_the_folder_and_the_fix(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"FashionMNIST/raw.*--download"):
        load_fashion_mnist(8, root=tmp_path)


def test_truncated_file_is_a_data_error(fashion_root):
    root, _ = fashion_root
    path = root / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_fashion_mnist(8, root=root)


def test_synthetic_data_is_seeded_and_shaped_like_fashion_mnist():
    (a_train, a_test), (b_train, b_test) = (synthetic_fashion_mnist(32, 256, 64, seed=5) for _ in range(2))
    c_train, _ = synthetic_fashion_mnist(32, 256, 64, seed=6)
    X, y = a_train.dataset.take(torch.arange(256))
    assert X.shape == (256, 1, 28, 28) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= X.min() and X.max() <= 1 and set(y.tolist()) <= set(range(10))
    assert torch.equal(a_train.dataset.images, b_train.dataset.images), "same seed must give the same images"
    assert torch.equal(a_test.dataset.labels, b_test.dataset.labels), "same seed must give the same labels"
    assert not torch.equal(a_train.dataset.images, c_train.dataset.images), "another seed must give other data"


def test_synthetic_data_is_learnable_by_a_nearest_template_rule():
    # A class-mean classifier fitted on the train split must beat chance by far on the test split:
    # the data carries signal, so accuracy reached by training means something.
    train, test = synthetic_fashion_mnist(64, 2000, 500, seed=0)
    X, y = train.dataset.images.flatten(1), train.dataset.labels
    means = torch.stack([X[y == c].mean(0) for c in range(10)])
    Xt, yt = test.dataset.images.flatten(1), test.dataset.labels
    acc = (torch.cdist(Xt, means).argmin(1) == yt).float().mean().item()
    assert acc > 0.5, f"nearest-template accuracy {acc:.2f}: synthetic data carries too little signal"


def test_batch_order_depends_on_seed_and_epoch_only():
    ds = ImageDataset(torch.zeros(10, 28, 28, dtype=torch.uint8), torch.arange(10))
    a, b = BatchLoader(ds, 4, shuffle=True, seed=1, drop_last=True), BatchLoader(ds, 4, shuffle=True, seed=1, drop_last=True)
    first = [i.tolist() for i in a.index_batches()]
    assert first == [i.tolist() for i in b.index_batches()] and len(first) == 2 and all(len(i) == 4 for i in first)
    a.set_epoch(1)
    assert first != [i.tolist() for i in a.index_batches()], "each epoch must reshuffle"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_size": 0}, ConfigError, "batch size must be a positive integer"),
    ({"train_size": 0}, ConfigError, "train_size must be a positive integer"),
    ({"test_size": -5}, ConfigError, "test_size must be a positive integer"),
])
def test_synthetic_rejects_bad_sizes(kwargs, error, match):
    args = {"batch_size": 8, "train_size": 64, "test_size": 16, **kwargs}
    with pytest.raises(error, match=match):
        synthetic_fashion_mnist(**args)


def test_empty_dataset_is_an_error():
    with pytest.raises(DataError, match="empty"):
        BatchLoader(ImageDataset(torch.zeros(0, 28, 28), torch.zeros(0, dtype=torch.long)), 4)
