"""Threaded loader: offsets from the tar headers, recycled buffers, reader threads in turns.

Every array is checked against an independent read of the same shard with ``tarfile`` and
``numpy.load``, so an offset, a reused buffer or a mixed-up batch slot shows as wrong data.
"""

from __future__ import annotations

import io
import itertools
import tarfile
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TinyDemo

from emb.loading.batch_reader import round_robin
from emb.loading.batches import LoaderError, LoaderSpec, eval_batches, train_batches
from emb.loading.buffer_pool import BufferPool
from emb.loading.shard_index import scan_shard
from emb.loading.shard_manifest import shard_sample_counts

IN_DIM = {"aef": 64, "tessera": 128}


def tar_arrays(url: str) -> dict[tuple[str, str], np.ndarray]:
    """{(key, name): array} of every ``{key}.{name}.npy`` member, read with tarfile + np.load."""
    out = {}
    with tarfile.open(url) as tar:
        for member in tar.getmembers():
            base = member.name.rpartition("/")[2]
            if member.isreg() and base.endswith(".npy"):
                key, _, name = base[:-4].partition(".")
                out[key, name] = np.load(io.BytesIO(tar.extractfile(member).read()))
    return out


def split_arrays(part: dict) -> dict[tuple[str, str], np.ndarray]:
    """The arrays of every shard of a manifest split; keys must be unique across its shards."""
    out: dict = {}
    for url in part["shards"]:
        arrays = tar_arrays(url)
        assert not out.keys() & arrays.keys(), f"{url}: key seen in another shard"
        out.update(arrays)
    return out


@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_scan_shard_offsets_read_the_same_arrays_as_tarfile(tiny_demo: TinyDemo, source):
    """Offsets, dtypes and shapes from the headers alone give back every array byte for byte."""
    part = tiny_demo.manifest(source)["splits"]["train"]
    for url, keys in zip(part["shards"], part["shard_keys"], strict=True):
        samples = scan_shard(url)
        assert [s.key for s in samples] == keys
        expected = tar_arrays(url)
        scanned = {(s.key, name) for s in samples for name in s.arrays}
        assert scanned == expected.keys()
        with open(url, "rb") as fh:
            for sample in samples:
                assert sample.url == url
                for name, at in sample.arrays.items():
                    want = expected[sample.key, name]
                    assert (at.dtype, at.shape, at.nbytes) == (want.dtype, want.shape, want.nbytes)
                    fh.seek(at.offset)
                    got = np.frombuffer(fh.read(at.nbytes), at.dtype).reshape(at.shape)
                    assert got.tobytes() == want.tobytes(), f"{sample.key}.{name}.npy differs"


SHAPE, DTYPE = (3, 4, 5), np.dtype(np.int8)


def test_buffer_pool_never_hands_out_a_buffer_a_tensor_still_holds() -> None:
    """A batch the trainer still holds must not be overwritten by the next read."""
    pool = BufferPool()
    buffer = pool.take(SHAPE, DTYPE)
    ref = weakref.ref(buffer)
    tensor = torch.from_numpy(buffer)
    del buffer
    other = pool.take(SHAPE, DTYPE)
    assert other is not ref()
    del tensor
    assert pool.take(SHAPE, DTYPE) is ref()  # `other` is still held: only the first is free
    del other


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(lambda b: torch.from_numpy(b)[1:], id="tensor-slice"),
        pytest.param(lambda b: torch.from_numpy(b)[0].view(-1), id="tensor-view"),
        pytest.param(lambda b: torch.from_numpy(b).permute(2, 0, 1), id="tensor-permute"),
        pytest.param(lambda b: b[:, ::2], id="numpy-view"),
        pytest.param(lambda b: b.reshape(-1)[3:], id="numpy-view-of-view"),
    ],
)
def test_buffer_pool_never_hands_out_a_buffer_a_view_still_holds(view) -> None:
    """A view alone (the whole batch dropped) still pins its buffer; dropping it frees it."""
    pool = BufferPool()
    buffer = pool.take(SHAPE, DTYPE)
    ref = weakref.ref(buffer)
    held = view(buffer)
    del buffer
    other = pool.take(SHAPE, DTYPE)
    assert other is not ref() and ref() is not None
    del held
    assert pool.take(SHAPE, DTYPE) is ref()
    del other


def test_buffer_pool_keeps_at_most_keep_buffers_per_shape() -> None:
    """Beyond ``keep`` the pool allocates buffers that it lets go when they are dropped."""
    pool = BufferPool(keep=2)
    a, b, c = (pool.take(SHAPE, DTYPE) for _ in range(3))
    assert len({id(a), id(b), id(c)}) == 3
    refs = [weakref.ref(x) for x in (a, b, c)]
    del a, b, c
    assert refs[2]() is None  # not kept: freed with its last reference
    first = pool.take(SHAPE, DTYPE)
    second = pool.take(SHAPE, DTYPE)
    third = pool.take(SHAPE, DTYPE)
    assert first is refs[0]() and second is refs[1]()
    assert third is not first and third is not second
    del first  # free again, but only for int8: another dtype gets a buffer of its own
    unsigned = pool.take(SHAPE, np.dtype(np.uint8))
    assert unsigned is not refs[0]() and unsigned.dtype == np.uint8


def counting(name: str, n: int | None, log: list[str], fail_after: int | None = None):
    """Yields ``(name, i)`` for i < n (forever if None); logs ``name`` when its finally runs."""
    try:
        for i in range(n) if n is not None else itertools.count():
            if fail_after is not None and i == fail_after:
                raise ValueError("boom")
            yield name, i
    finally:
        log.append(name)


def test_round_robin_takes_turns_from_first_and_drops_workers_that_end() -> None:
    """Batch i comes from worker i % workers; an exhausted worker leaves the rotation."""
    log: list[str] = []
    workers = [counting("a", 1, log), counting("b", 3, log), counting("c", 2, log)]
    got = list(round_robin(workers, first=1))
    assert got == [("b", 0), ("c", 0), ("a", 0), ("b", 1), ("c", 1), ("b", 2)]
    assert sorted(log) == ["a", "b", "c"]


def test_round_robin_raises_a_worker_error_in_the_consumer() -> None:
    """A reader's exception (a bad shard) reaches the training loop with its message."""
    log: list[str] = []
    workers = [counting("a", None, log, fail_after=2), counting("b", None, log)]
    got = []
    with pytest.raises(ValueError, match="boom"):
        for item in round_robin(workers):
            got.append(item)
    assert got == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert not reader_threads()


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("emb-reader-")]


def test_closing_round_robin_early_joins_threads_and_closes_workers() -> None:
    """A run that stops mid-epoch must not leave reader threads or open shards behind."""
    log: list[str] = []
    workers = [counting("a", None, log), counting("b", None, log)]  # held: no GC close
    consumer = round_robin(workers, depth=2)
    assert next(consumer) == ("a", 0)
    assert len(reader_threads()) == 2
    time.sleep(0.2)  # let both readers fill their queues and block on them
    consumer.close()
    assert not reader_threads()
    assert sorted(log) == ["a", "b"]
    assert all(w.gi_frame is None for w in workers)  # closed, not just suspended


def spec(source: str, workers: int, batch_size: int = 4) -> LoaderSpec:
    return LoaderSpec(source, IN_DIM[source], batch_size, workers, shuffle_buffer=8, seed=5)


def epoch(part: dict, spec: LoaderSpec, start_batch: int = 0) -> list[dict]:
    return list(
        train_batches(
            part["shards"], part["samples"], spec, 0, 1, epoch=1, start_batch=start_batch,
            shard_samples=shard_sample_counts(part),
        )
    )  # fmt: skip


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.keys() == y.keys(), i
        for name in x:
            if isinstance(x[name], list):
                assert x[name] == y[name], (i, name)
            else:
                assert x[name].dtype == y[name].dtype, (i, name)
                assert torch.equal(x[name], y[name]), (i, name)


@pytest.mark.parametrize("workers", [0, 1, 2, 4])
@pytest.mark.parametrize("source", ["aef", "tessera"])
def test_every_batch_row_holds_the_sample_its_key_names(tiny_demo: TinyDemo, source, workers):
    """All batches of an epoch held at once: a buffer reused too early shows as wrong rows.
    An epoch holds each sample at most once; what it leaves out is the remainder past the
    last full batch (``drop_last``), never a repeat of one sample in place of another."""
    part = tiny_demo.manifest(source)["splits"]["train"]
    arrays = split_arrays(part)
    batch_size = 4
    batches = epoch(part, spec(source, workers, batch_size))
    keys = {k for ks in part["shard_keys"] for k in ks}
    assert len(keys) == part["samples"] and len(keys) % batch_size  # a remainder to drop
    assert len(batches) == len(keys) // batch_size
    read = []
    for batch in batches:
        names = ["emb", "label"] + (["scale"] if source == "tessera" else [])
        assert set(batch) == {*names, "__key__", "aug"}
        assert len(batch["__key__"]) == batch_size
        for row, key in enumerate(batch["__key__"]):
            read.append(key)
            for name in names:
                want = torch.from_numpy(arrays[key, name])
                assert batch[name].dtype == want.dtype
                assert torch.equal(batch[name][row], want), (key, name)
    assert len(read) == len(set(read)), "a sample read twice in one epoch"
    assert set(read) <= keys and len(keys - set(read)) == len(keys) % batch_size


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_reader_threads_do_not_change_the_epoch(tiny_demo: TinyDemo, workers: int) -> None:
    """The epoch is cut into batches before the threads read them: any thread count gives the
    batches of no thread, in order."""
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    assert_same_batches(epoch(part, spec("tessera", workers)), epoch(part, spec("tessera", 0)))


@pytest.mark.parametrize(("workers", "start_batch"), [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_resumed_epoch_is_the_tail_of_the_full_epoch(tiny_demo, workers, start_batch):
    """A resume mid-epoch yields exactly the batches the full epoch had from there: no sample
    of the skipped batches again, none of the remaining ones lost."""
    part = tiny_demo.manifest("tessera")["splits"]["train"]
    full = epoch(part, spec("tessera", workers))
    tail = epoch(part, spec("tessera", workers), start_batch=start_batch)
    assert len(full) > start_batch + 1
    assert_same_batches(full[start_batch:], tail)


def test_epochs_differ_and_each_holds_its_samples_once(tiny_demo: TinyDemo) -> None:
    """Two epochs draw different orders (and so drop different remainders)."""
    part = tiny_demo.manifest("aef")["splits"]["train"]
    counts = shard_sample_counts(part)
    orders = [
        [k for b in train_batches(part["shards"], part["samples"], spec("aef", 2), 0, 1, e,
                                  shard_samples=counts) for k in b["__key__"]]
        for e in (0, 1)
    ]  # fmt: skip
    assert orders[0] != orders[1]
    assert all(len(o) == len(set(o)) for o in orders)


def write_npy_tar(path: Path, samples: dict[str, dict[str, np.ndarray]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key, arrays in samples.items():
            for name, array in arrays.items():
                data = io.BytesIO()
                np.save(data, array)
                info = tarfile.TarInfo(f"{key}.{name}.npy")
                info.size = data.tell()
                data.seek(0)
                tar.addfile(info, data)
    return path


def tile(t: int) -> dict[str, np.ndarray]:
    return {"emb": np.zeros((64, t, t), np.int8), "label": np.zeros((t, t), np.uint8)}


@pytest.mark.parametrize("workers", [0, 1])
def test_samples_of_different_tile_shapes_in_one_batch_name_shard_key_and_shapes(
    tmp_path: Path, workers: int
) -> None:
    """A shard mixing tile sizes cannot be batched; the error says where and why."""
    shard = write_npy_tar(tmp_path / "mixed-0000.tar", {"a": tile(8), "b": tile(4)})
    with pytest.raises(LoaderError) as err:
        list(
            eval_batches([str(shard)], LoaderSpec("aef", 64, 2, workers, shuffle_buffer=0, seed=0))
        )
    message = str(err.value)
    assert "mixed-0000.tar" in message and "sample b" in message
    assert "64, 4, 4" in message and "64, 8, 8" in message
    assert not reader_threads()
