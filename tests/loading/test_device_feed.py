"""Batches to the GPU from pinned memory, one step ahead (emb.loading.device_feed).

On the CPU the feed hands the loader's batches over untouched (the loop's CPU path is the one
it had). The CUDA tests (marker ``gpu``; ``pytest -m gpu`` where a GPU is) check what only a
GPU can show: the copies overlap nothing they must not (a pinned buffer is never handed out
again before the copy from it completed) and training through the feed gives the weights of
training on the same batches copied synchronously.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TinyDemo
from training_runs import resolve_config

from emb.loading.batch_reader import pinned_array
from emb.loading.batches import LoaderSpec, train_batches
from emb.loading.buffer_pool import BufferPool
from emb.loading.device_feed import _Feed, on_device
from emb.loading.shard_manifest import read_manifest, shard_sample_counts
from emb.models.runtime import Host, Runtime
from emb.training.loop import build_loop, parameter_digest
from emb.training.run_config import load
from emb.training.stop_request import StopRequest

gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)"),
]


def test_on_the_cpu_batches_pass_through_untouched() -> None:
    batches = [{"emb": torch.zeros(2, 3), "aug": torch.ones(2), "__key__": ["a", "b"]}]
    out = list(on_device(iter(batches), torch.device("cpu")))
    assert len(out) == 1 and out[0] is batches[0]


@gpu[0]
@gpu[1]
def test_a_pinned_buffer_is_not_handed_out_again_before_its_copy_completed() -> None:
    """A pool of one pinned buffer, its copy queued behind 0.1 s of GPU work: until the copy's
    event has completed, the pool hands out a fresh buffer, never the one being copied."""
    device = torch.device("cuda")
    pool = BufferPool(keep=1, allocate=pinned_array)
    buffer = pool.take((1024,), np.dtype(np.int8))
    buffer[:] = 7
    feed = _Feed(device)
    with torch.cuda.stream(feed.stream):
        torch.cuda._sleep(200_000_000)  # keeps the side stream, and so the copy, waiting
    batch, copied = feed.stage({"emb": torch.from_numpy(buffer)})
    del buffer  # only the feed's record of the copy holds it now
    assert not copied.query()
    assert pool.take((1024,), np.dtype(np.int8)) is not pool._buffers[((1024,), "|i1")][0]
    device_batch = feed.hand_over(batch, copied)
    torch.cuda.synchronize()
    feed.release()
    assert not feed.copying
    again = pool.take((1024,), np.dtype(np.int8))
    assert again is pool._buffers[((1024,), "|i1")][0]  # released once the copy was done
    assert torch.equal(device_batch["emb"].cpu(), torch.full((1024,), 7, dtype=torch.int8))


@gpu[0]
@gpu[1]
def test_the_feed_gives_the_weights_of_synchronous_copies(tiny_demo: TinyDemo, tmp_path) -> None:
    """20 steps on the same batches: through the feed (pinned, copied ahead on a side stream)
    and from pageable memory copied by the step itself: bitwise the same weights."""
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    digests = []
    for pinned in (True, False):
        run_dir = tmp_path / f"run-{pinned}"
        config = resolve_config(tiny_demo, run_dir, "train.max_updates=20", "train.epochs=100",
                                "ema.enabled=true", arch="deeplab")  # fmt: skip
        cfg = load(config)
        cuda = Runtime.resolve(cfg.train, cfg.model.arch, Host(gpus=1, local_rank=0), training=True)
        loop = build_loop(load(config), run_dir, 0, 1, cuda, StopRequest())
        cfg, train = loop.cfg, read_manifest(Path(load(config).data.manifest))["splits"]["train"]
        spec = LoaderSpec(cfg.data.source, cfg.model.in_dim, loop.plan.batch, 2,
                          cfg.train.shuffle_buffer, cfg.train.seed, pin_memory=pinned)  # fmt: skip
        steps = 0
        for epoch in range(20):
            host = train_batches(train["shards"], train["samples"], spec, 0, 1, epoch,
                                 shard_samples=shard_sample_counts(train))  # fmt: skip
            for batch in on_device(host, torch.device("cuda")) if pinned else host:
                loop.trainer.train_step([batch])
                steps += 1
                if steps == 20:
                    break
            if steps == 20:
                break
        torch.cuda.synchronize()
        digests.append(parameter_digest(loop.trainer.model))
        loop.log.close()
    assert digests[0] == digests[1]
