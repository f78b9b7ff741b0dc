"""Fashion-MNIST from real-format IDX files, the synthetic stand-in, and the shared batch order."""

import gzip

import pytest
import torch

from correctness.helpers import write_idx
from mgpu.data import BatchLoader, ImageDataset, load_fashion_mnist, synthetic_fashion_mnist
from mgpu.errors import ConfigError, DataError, DataNotFoundError


@pytest.fixture
def fashion_root(tmp_path):
    """A torchvision-layout folder with 12 train and 5 test images of known content: the train
    files gzipped only (as downloaded), the test files unpacked."""
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


def test_gzipped_and_unpacked_files_load_alike_and_the_folder_is_left_as_it_is(fashion_root, tmp_path):
    root, data = fashion_root
    raw = root / "FashionMNIST" / "raw"
    before = sorted(p.name for p in raw.iterdir())
    train, test = load_fashion_mnist(4, root=root)
    assert sorted(p.name for p in raw.iterdir()) == before, "loading must not unpack files into the data folder"
    unpacked = tmp_path / "unpacked"
    (unpacked / "FashionMNIST" / "raw").mkdir(parents=True)
    for prefix, (images, labels) in data.items():
        write_idx(unpacked / "FashionMNIST" / "raw" / f"{prefix}-images-idx3-ubyte", images)
        write_idx(unpacked / "FashionMNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", labels)
    train2, test2 = load_fashion_mnist(4, root=unpacked)
    for a, b in ((train, train2), (test, test2)):
        assert torch.equal(a.dataset.images, b.dataset.images) and torch.equal(a.dataset.labels, b.dataset.labels)
        assert a.dataset.images.dtype == torch.uint8 and a.dataset.labels.dtype == torch.int64
    assert torch.equal(train.dataset.images, data["train"][0]), "gzipped train images changed on loading"
    assert [i.tolist() for i in train.index_batches()] == [i.tolist() for i in train2.index_batches()]


def _damage(raw, name, how):
    """Spoil one file of a fashion_root folder; returns the path the error must name."""
    path = raw / name if (raw / name).exists() else raw / f"{name}.gz"
    if how == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "html":
        path.write_bytes(b"<html>404 Not Found</html>")
    elif how == "labels-as-images":
        path.unlink()
        path = write_idx(raw / name, torch.zeros(5, dtype=torch.uint8))
    elif how == "fewer-labels":
        path.unlink()
        path = write_idx(raw / name, torch.zeros(3, dtype=torch.uint8))
    elif how == "no-examples":
        path.unlink()
        path = write_idx(raw / name, torch.zeros(0, 28, 28, dtype=torch.uint8))
    elif how == "label-11":
        path.unlink()
        path = write_idx(raw / name, torch.full((5,), 11, dtype=torch.uint8))
    elif how == "gz-cut":
        path.write_bytes(path.read_bytes()[:200])  # a download cut short
    elif how == "gz-not-gzip":
        path.write_bytes(b"IDX but not gzipped")
    elif how == "gz-payload-cut":
        path.unlink()
        path = write_idx(raw / name, torch.zeros(12, 28, 28, dtype=torch.uint8), compress=True)
        payload = gzip.decompress(path.read_bytes())
        path.write_bytes(gzip.compress(payload[:-28]))
    return path


@pytest.mark.parametrize("name, how, match", [
    ("t10k-images-idx3-ubyte", "truncate", r"is truncated or corrupt: header says \[5, 28, 28\], payload has 3820 bytes"),
    ("t10k-images-idx3-ubyte", "empty", r"is an empty file \(0 bytes\)"),
    ("t10k-labels-idx1-ubyte", "html", r"is not an IDX file of the expected kind \(magic number 2049\)"),
    ("t10k-images-idx3-ubyte", "labels-as-images", r"is not an IDX file of the expected kind \(magic number 2051\)"),
    ("t10k-labels-idx1-ubyte", "fewer-labels", r"t10k-images-idx3-ubyte holds 5 images but .*t10k-labels-idx1-ubyte holds 3 labels"),
    ("t10k-images-idx3-ubyte", "no-examples", r"holds no examples: the dataset is empty"),
    ("t10k-labels-idx1-ubyte", "label-11", r"labels go up to 11, Fashion-MNIST has 10 classes"),
    ("train-images-idx3-ubyte", "gz-cut", r"\.gz is truncated or corrupt: it does not gunzip"),
    ("train-labels-idx1-ubyte", "gz-not-gzip", r"\.gz is truncated or corrupt: it does not gunzip"),
    ("train-images-idx3-ubyte", "gz-payload-cut", r"\.gz is truncated or corrupt: header says \[12, 28, 28\]"),
    ("train-images-idx3-ubyte", "empty", r"\.gz is an empty file \(0 bytes\)"),
])
def test_bad_files_are_one_line_data_errors_naming_the_file(fashion_root, name, how, match):
    root, _ = fashion_root
    path = _damage(root / "FashionMNIST" / "raw", name, how)
    with pytest.raises(DataError, match=match) as info:
        load_fashion_mnist(4, root=root)
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message


def test_a_failed_download_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    from torchvision.datasets import FashionMNIST

    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried http://mirror/, got:\n"
                           "<urlopen error [Errno -3] Temporary failure in name resolution>\n")

    monkeypatch.setattr(FashionMNIST, "download", offline)
    with pytest.raises(DataNotFoundError, match=r"downloading Fashion-MNIST into .*FashionMNIST/raw failed: "
                                                r"Error downloading .*name resolution") as info:
        load_fashion_mnist(8, root=tmp_path, download=True)
    assert "\n" not in str(info.value)


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
