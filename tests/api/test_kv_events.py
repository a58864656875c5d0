"""METRALE_KV_EVENTS: vLLM's KV event frames over ZMQ, decoded by msgpack as a subscriber reads them; replay for a
late subscriber; each tenant's chains under its own namespace block; engines attaching and leaving."""
import hashlib
import struct
import time

import msgpack
import pytest
import zmq

from inference.engine.kv_events import BlockRemoved, BlockStored
from inference.operations.kv_events import KVEventPublisher, KVEventsConfig, reachable
from inference.operations.kv_wire import namespace_block, routing_token_ids

VOCAB = 49152
BS = 4
STORED_KEYS = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}


@pytest.fixture
def publisher():
    pub = KVEventPublisher(KVEventsConfig(endpoint="tcp://*:0", replay_endpoint="tcp://*:0", topic="kv"))
    yield pub
    pub.close()


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def connect(publisher, context, kind):
    sock = context.socket(kind)
    sock.connect(reachable(publisher.replay_endpoint if kind == zmq.DEALER else publisher.endpoint, "127.0.0.1"))
    return sock


def replay(publisher, context, start=0):
    """What a late subscriber gets by replay from `start`: [(topic, seq, decoded batch)] until the end marker."""
    dealer = connect(publisher, context, zmq.DEALER)
    dealer.send_multipart([b"", struct.pack(">Q", start)])
    got = []
    while True:
        assert dealer.poll(5000), "no replay answer"
        frames = dealer.recv_multipart()
        assert frames[0] == b"" and len(frames) == 4
        if frames[2] == struct.pack(">q", -1):
            return got
        got.append((frames[1], struct.unpack(">Q", frames[2])[0], msgpack.unpackb(frames[3])))


def wait_published(publisher, context, n):
    """The first `n` batches, once the publisher has sent them (read back by replay)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = replay(publisher, context)
        if len(got) >= n:
            return got
    raise AssertionError(f"fewer than {n} batches published")


def test_a_late_subscriber_replays_every_batch_in_vllms_layout(publisher, context):
    sink = publisher.attach(VOCAB)
    chain = BlockStored([-5, 7], None, [1, 2, 3, 4, 5, 6, 7, 8], BS, "tenant-a", None)
    sink([chain])
    sink([BlockStored([9], 7, [9, 10, 11, 12], BS, "tenant-a", None), BlockRemoved([-5])])
    batches = wait_published(publisher, context, 3)

    assert [(topic, seq) for topic, seq, _ in batches] == [(b"kv", 0), (b"kv", 1), (b"kv", 2)]
    for _, _, batch in batches:
        ts, events, rank = batch  # positional [ts, events, data_parallel_rank]
        assert isinstance(ts, float) and abs(ts - time.time()) < 60 and rank == 0
    assert batches[0][2][1] == [{"type": "AllBlocksCleared"}]  # an engine attached: forget what came before

    stored = batches[1][2][1][0]
    assert set(stored) == STORED_KEYS
    root_hash, root_ids = namespace_block("tenant-a", BS, VOCAB)
    # The chain from block 0 hangs under the tenant's namespace block; hashes are unsigned 64-bit.
    assert stored["block_hashes"] == [root_hash, (1 << 64) - 5, 7]
    assert stored["parent_block_hash"] is None
    assert stored["token_ids"] == [*root_ids, 1, 2, 3, 4, 5, 6, 7, 8]
    assert len(stored["token_ids"]) == len(stored["block_hashes"]) * BS
    assert (stored["block_size"], stored["medium"], stored["lora_id"], stored["lora_name"]) == (BS, "GPU", None, None)

    more, removed = batches[2][2][1]
    assert more["parent_block_hash"] == 7 and more["block_hashes"] == [9] and more["token_ids"] == [9, 10, 11, 12]
    assert removed == {"type": "BlockRemoved", "block_hashes": [(1 << 64) - 5], "medium": "GPU"}
    assert [seq for _, seq, _ in replay(publisher, context, start=2)] == [2]


def test_live_subscribers_get_consecutive_sequence_numbers(publisher, context):
    sub = connect(publisher, context, zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sink = publisher.attach(VOCAB)
    deadline, frames = time.monotonic() + 5, None
    while frames is None and time.monotonic() < deadline:  # a SUB socket misses what is sent before it joins
        sink([BlockRemoved([1])])
        if sub.poll(100):
            frames = sub.recv_multipart()
    assert frames is not None and len(frames) == 3
    first = struct.unpack(">Q", frames[1])[0]
    sink([BlockRemoved([2])])
    sink([BlockRemoved([3])])
    seen = []
    while len(seen) < 2 or seen[-1][1] != [{"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}]:
        assert sub.poll(5000)
        topic, seq, payload = sub.recv_multipart()
        seen.append((struct.unpack(">Q", seq)[0], msgpack.unpackb(payload)[1]))
    assert [seq for seq, _ in seen] == list(range(first + 1, first + 1 + len(seen)))


def router_keys(token_ids, block_size, lora_name=None):
    """vllm-router 0.1.17's key of each full block (kv_index local_hashes): SHA-256 of the adapter's name and
    each token id as u32 little-endian, no chaining."""
    keys = []
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256((lora_name or "").encode())
        for t in token_ids[i:i + block_size]:
            h.update(struct.pack("<I", t))
        keys.append(h.hexdigest())
    return keys


def test_a_tenants_blocks_never_match_another_tenants_prompt(publisher, context):
    sink = publisher.attach(VOCAB)
    prompt = list(range(40, 52))
    sink([BlockStored([11, 12, 13], None, prompt, BS, "tenant-a", None)])
    sink([BlockStored([21, 22, 23], None, prompt, BS, "tenant-b", None)])
    a, b = [batch[1][0] for _, _, batch in wait_published(publisher, context, 3)[1:]]
    published = {"a": router_keys(a["token_ids"], BS), "b": router_keys(b["token_ids"], BS)}
    assert published["a"][1:] == published["b"][1:] and published["a"][0] != published["b"][0]

    def matched(chain, query):  # the router's longest prefix match from the root
        n = 0
        while n < min(len(chain), len(query)) and chain[n] == query[n]:
            n += 1
        return n

    query_a = router_keys(routing_token_ids("tenant-a", prompt + [99], BS, VOCAB), BS)
    assert matched(published["a"], query_a) == 4 and matched(published["b"], query_a) == 0
    # A router tokenizing the prompt itself (without the render routes) matches no salted block at all.
    assert matched(published["a"], router_keys(prompt, BS)) == 0


def test_a_replaced_engines_events_are_dropped_and_a_stopped_one_clears(publisher, context):
    old = publisher.attach(VOCAB)
    new = publisher.attach(VOCAB)
    old([BlockRemoved([1])])
    new([BlockRemoved([2])])
    publisher.detach(old)  # no longer the publishing engine: nothing to say
    publisher.detach(new)
    events = [batch[1] for _, _, batch in wait_published(publisher, context, 4)]
    assert events == [[{"type": "AllBlocksCleared"}], [{"type": "AllBlocksCleared"}],
                      [{"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}], [{"type": "AllBlocksCleared"}]]


def test_the_setting_takes_vllms_fields_or_an_endpoint_and_names_what_is_wrong():
    assert KVEventsConfig.parse(None) is None and KVEventsConfig.parse(" ") is None
    assert KVEventsConfig.parse("tcp://*:6000") == KVEventsConfig(endpoint="tcp://*:6000")
    parsed = KVEventsConfig.parse('{"endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001", "buffer_steps": 5}')
    assert (parsed.replay_endpoint, parsed.buffer_steps, parsed.enabled) == ("tcp://*:6001", 5, True)
    assert not KVEventsConfig.parse('{"publisher": "null"}').enabled
    for bad, words in (('{"endpont": "tcp://*:1"}', "unknown field(s) endpont"), ("{nope", "not JSON"),
                       ('{"hwm": 0}', "hwm must be a positive integer"), ("localhost:5557", "ZMQ address"),
                       ('{"publisher": "kafka"}', "publisher must be")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            KVEventsConfig.parse(bad)


def test_sources_name_the_host_a_router_reached_for_a_wildcard_bind():
    assert reachable("tcp://*:5557", "10.0.0.5") == "tcp://10.0.0.5:5557"
    assert reachable("tcp://0.0.0.0:5557", "fd00::1") == "tcp://[fd00::1]:5557"
    assert reachable("tcp://events.internal:5557", "10.0.0.5") == "tcp://events.internal:5557"
    assert reachable("ipc:///tmp/kv", "10.0.0.5") == "ipc:///tmp/kv"


def test_a_setting_the_publisher_cannot_use_is_a_system_check_error(settings):
    from inference.operations.checks import check_kv_events_setting

    settings.METRALE = {**settings.METRALE, "KV_EVENTS": '{"endpoint": "tcp://*:5557", "replay": "tcp://*:5558"}'}
    (error,) = check_kv_events_setting(None)
    assert error.id == "metrale.E003" and "unknown field(s) replay" in error.msg
    settings.METRALE = {**settings.METRALE, "KV_EVENTS": "tcp://*:5557"}
    assert check_kv_events_setting(None) == []
