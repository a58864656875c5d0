"""kv_pool.KVPool: zero-filled views of one mapping on the CPU, its pages committed only as they are written."""
import torch

from inference.engine.kv_pool import KVPool


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_the_pool_reads_as_zeros_and_its_views_do_not_overlap():
    pool = KVPool(3, (4, 16, 2, 8), torch.bfloat16, torch.device("cpu"))
    assert pool.nbytes == 2 * 3 * 4 * 16 * 2 * 8 * 2
    tensors = [t for pair in pool.caches for t in pair]
    assert all(t.shape == (4, 16, 2, 8) and t.dtype == torch.bfloat16 and not t.any() for t in tensors)
    for i, t in enumerate(tensors):
        t.fill_(i + 1)
    assert [int(t.float().mean()) for t in tensors] == list(range(1, 7))


def test_pages_are_committed_as_blocks_are_written():
    before = _rss_anon_kib()
    pool = KVPool(4, (512, 16, 4, 64), torch.float32, torch.device("cpu"))  # 64 MiB
    allocated = _rss_anon_kib()
    assert pool.nbytes == 64 * 2**20
    assert allocated - before < 16 * 1024, "an untouched pool must not be resident"
    k, _ = pool.caches[0]
    k[:128].fill_(1.0)  # 2 MiB of one layer's K
    written = _rss_anon_kib()
    assert 2 * 1024 - 64 <= written - allocated < 16 * 1024


def test_copy_blocks_copies_every_layers_k_and_v_of_each_block_and_nothing_else():
    pool = KVPool(3, (6, 4, 2, 8), torch.int8, torch.device("cpu"))
    for t in (t for pair in pool.caches for t in pair):
        t.copy_(torch.randint(-100, 100, t.shape, dtype=torch.int8))
    before = [(k.clone(), v.clone()) for k, v in pool.caches]
    assert pool.copy_blocks(torch.tensor([4]), torch.tensor([1]))
    assert pool.copy_blocks(torch.tensor([0, 5]), torch.tensor([2, 3]))
    moved = {4: 1, 0: 2, 5: 3}
    for (k, v), (k0, v0) in zip(pool.caches, before):
        for block in range(6):
            source = moved.get(block, block)
            assert torch.equal(k[block], k0[source]) and torch.equal(v[block], v0[source])


def test_a_pool_of_layers_of_two_shapes_leaves_copies_to_the_caller():
    pool = KVPool(2, (6, 4, 2, 8), torch.bfloat16, torch.device("cpu"), shapes=[(6, 4, 2, 8), (3, 4, 2, 8)])
    assert not pool.copy_blocks(torch.tensor([1]), torch.tensor([0]))
