#!/usr/bin/env python3
"""Publishes KV-cache event scenarios through the REAL vLLM 0.33.0 / SGLang 0.5.23 publishers
(their own `ZmqEventPublisher`, `KVEventBatch`, `BlockStored`, `BlockRemoved`,
`AllBlocksCleared`, taken out of the wheels by scripts/engine-venv.sh), and through a publisher
that restates TensorRT-LLM's (`TrtllmPublisher`, class `Trtllm`: its own `kv_cache_events`
module needs the TensorRT-LLM runtime, which is not installable here, so its wire format is
restated field by field as engine/tests/fixtures/gen_fixtures.py does: PUB + ROUTER replay
sockets, positional batches with the rank filled in, tagged-map events with defaulted fields
left out, int64 block hashes, `lora_id` without `lora_name`, per-block `mm_keys`, an image's
digest string in place of its first token id), and writes the exact model of the engine caches
it produced.

    drive.py SCENARIO --endpoint tcp://127.0.0.1:P [--replay tcp://127.0.0.1:R] \
        [--dp-size N] --worker-id W --block-size B --out model.json

Rank r of the engine publishes on port P + r (replay R + r), by the publishers' own rule.
The driver plays the engine: every block it stores belongs to a request (token ids, LoRA name,
cache salt, multimodal items); it names blocks with engine-style hashes (vLLM: SHA-256 digests,
published as 32 bytes or their low 64 bits; SGLang and TensorRT-LLM: signed int64), which
ckf-relay must NOT use as keys, and computes each block's canonical hash from the request with
the reference `proto/token_hash/ckf_token_hash.py` (for TensorRT-LLM, from the token ids a
query sends: IMAGE_DIGEST_TOKEN at an image's first position, the image named by its `mm_key`
uuid, else its digest; an adapter named by `lora_id` is the LoRA name "<decimal id>").

Talking to the test (one JSON line on stdout per step; the test answers `go` on stdin):
  READY {members: [{worker_id, dp_rank, canonical: [probe]}]}  warm-up: every 50 ms each
      member's publisher sends [AllBlocksCleared, BlockStored(probe)] until `go` (ZMQ drops
      what a PUB sends before the subscriber has joined); the test answers once every member
      holds exactly its probe. The driver then clears every member.
  CHECK {members: [...], queries: [...]}  the producer must now hold exactly this (polled).
  EMPTIED {members: [...]}  heartbeats every 50 ms until `go`: the producer must have cleared
      these members on its own (engine restart, replay that could not fill a gap).
  CATCHUP {members: [...], queries: [...]}  as CHECK, with heartbeats every 50 ms until `go`:
      a producer that was down learns from a live batch what it missed (a batch sent before
      its SUB socket reconnected is lost, the next one shows the gap).
  PAUSE {name}  the driver waits for `go` while the test acts on the producer (`kill`: kill -9
      it; `restart`: start it again on the same state).
  DONE  the final model is in --out (same shape as CHECK); the publishers stay up until `go`.
"""

import argparse
import collections
import hashlib
import json
import os
import pathlib
import queue
import select
import socket
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "proto" / "token_hash"))
sys.path.insert(0, os.environ.get("CKF_ENGINE_PUBLISHERS", str(ROOT / "target" / "engine-publishers")))

import msgspec  # noqa: E402

from ckf_token_hash import block_hash, block_seed, mm_identifier_hash, next_sequence_hash  # noqa: E402

sys.path.insert(0, str(ROOT / "engine" / "tests" / "fixtures"))
import trtllm_wire  # noqa: E402

try:
    from sglang.srt.disaggregation import kv_events as sglang_events  # noqa: E402
    from vllm.distributed import kv_events as vllm_events  # noqa: E402
except ImportError as error:  # pragma: no cover - a setup problem, say how to fix it
    sys.exit(f"drive.py: the engines' publisher modules are missing ({error}): run scripts/engine-venv.sh")

U64 = (1 << 64) - 1
# The token id a TensorRT-LLM item digest (sent as a string in place of the token id at the
# item's first position) decodes to: ckf-engine's IMAGE_DIGEST_TOKEN = u32::MAX.
IMAGE_DIGEST_TOKEN = (1 << 32) - 1
# TensorRT-LLM's `mm_token_id_offset`: an item's k-th position (k >= 1) is sent as this + k
# (above every text token id of tokens()).
MM_TOKEN_ID_OFFSET = 200_000
# How long to wait for the test's answer to a step before giving up (the test's own deadlines
# are shorter; this only stops an orphaned driver).
ANSWER_TIMEOUT_S = 120.0
WARMUP_INTERVAL_S = 0.05


# --- the test protocol ---------------------------------------------------------------------


def say(kind, body=None):
    line = kind if body is None else f"{kind} {json.dumps(body, sort_keys=True)}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def answered(timeout):
    """Whether the test wrote `go` within `timeout` seconds; exits when it went away."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return False
    line = sys.stdin.readline()
    if not line:
        sys.exit("drive.py: the test closed stdin")
    if line.strip() != "go":
        sys.exit(f"drive.py: unexpected answer {line!r}")
    return True


def wait_answer(tick=None):
    """Calls `tick()` every 50 ms until the test answers `go`."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if answered(WARMUP_INTERVAL_S):
            return
    sys.exit("drive.py: no answer from the test")


# --- requests and the engines' own block hashes -----------------------------------------------


class Request:
    """One request's token ids and its request-wide keys; blocks are `block_size` tokens.

    `multimodal`: (identifier, offset, length) items in token positions of the request.
    `mm_digests`: identifier -> the item's digest (64 hex digits), for TensorRT-LLM items the
    request named by a uuid (the identifier is then the uuid; TensorRT-LLM still sends the
    digest as the `mm_key`'s `hash` and as the item's first token id). An item not listed is
    named by its digest itself. See `trtllm_request`."""

    def __init__(self, tokens, block_size, lora_name=None, cache_salt=None, multimodal=(), mm_digests=None):
        assert len(tokens) % block_size == 0, "requests here are whole blocks"
        self.tokens = list(tokens)
        self.block_size = block_size
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.multimodal = list(multimodal)
        self.mm_digests = dict(mm_digests or {})
        self.blocks = len(tokens) // block_size
        seed = block_seed(cache_salt, lora_name)
        self.canonical = []
        self.digests = []
        parent_digest = b""
        for index in range(self.blocks):
            mm = [mm_identifier_hash(ident) for ident, _, _ in self.block_items(index)]
            local = block_hash(self.block_tokens(index), [h for h in mm if h is not None], seed)
            self.canonical.append(local if index == 0 else next_sequence_hash(self.canonical[-1], local))
            # The engine's own name for the block: a digest of the parent's name, the tokens
            # and every extra key (like vLLM's sha256 block hash); unrelated to the canonical one.
            material = repr((parent_digest, self.block_tokens(index), self.extra_keys(index)))
            parent_digest = hashlib.sha256(material.encode()).digest()
            self.digests.append(parent_digest)

    def block_tokens(self, index):
        return self.tokens[index * self.block_size : (index + 1) * self.block_size]

    def block_items(self, index):
        start, end = index * self.block_size, (index + 1) * self.block_size
        return [(i, o, n) for (i, o, n) in self.multimodal if n > 0 and o < end and start < o + n]

    def extra_keys(self, index):
        """The block's extra keys as vLLM 0.33 publishes them (`to_event_extra_keys`): the LoRA
        name, then `(mm identifier, offset in the block)` pairs, then the cache salt on the
        request's first block only; None when empty."""
        keys = []
        if self.lora_name:
            keys.append(self.lora_name)
        start = index * self.block_size
        keys.extend((ident, offset - start) for ident, offset, _ in self.block_items(index))
        if index == 0 and self.cache_salt:
            keys.append(self.cache_salt)
        return tuple(keys) if keys else None

    def trtllm_block(self, index):
        """Block `index` as TensorRT-LLM publishes it: (token ids, mm keys). Each item's first
        position, which holds IMAGE_DIGEST_TOKEN in `tokens` (what a query sends), carries the
        item's digest (a string) instead; the mm keys are one (digest, start_offset, uuid) per
        item the block overlaps, start_offset being where the block's run starts in the item
        (0 in the block holding the item's first position), uuid None unless the request
        named the item by one."""
        start = index * self.block_size
        ids = list(self.block_tokens(index))
        keys = []
        for ident, offset, _ in self.block_items(index):
            digest = self.mm_digests.get(ident, ident)
            if start <= offset:
                assert ids[offset - start] == IMAGE_DIGEST_TOKEN, "an item starts at IMAGE_DIGEST_TOKEN"
                ids[offset - start] = digest
            keys.append((digest, max(start - offset, 0), ident if ident in self.mm_digests else None))
        return ids, keys

    def query(self, name, blocks=None, extra_tokens=(), lora_name=None, cache_salt=None):
        """A token query over the first `blocks` blocks (all by default), plus `extra_tokens`;
        the request's own keys unless overridden ("" = none)."""
        blocks = self.blocks if blocks is None else blocks
        tokens = self.tokens[: blocks * self.block_size] + list(extra_tokens)
        return {
            "name": name,
            "token_ids": tokens,
            "lora_name": self.lora_name or "" if lora_name is None else lora_name,
            "cache_salt": self.cache_salt or "" if cache_salt is None else cache_salt,
            "multimodal": [
                {"identifier": i, "offset": o, "length": n}
                for (i, o, n) in self.multimodal
                if o < len(tokens)
            ],
        }


def tokens(start, count):
    """Deterministic token ids (no randomness: every run publishes the same bytes)."""
    return [(start + 7919 * i) % 150_000 + 1 for i in range(count)]


def trtllm_request(token_ids, block_size, images=(), lora_id=None):
    """A TensorRT-LLM request over `token_ids` (whole blocks) with `images`: (digest, offset,
    length, uuid or None) items, each item's positions overwritten as a query for its blocks
    sends them (IMAGE_DIGEST_TOKEN at the first, MM_TOKEN_ID_OFFSET + k at the k-th after it).
    Canonical hashes follow ckf-relay's rule for TensorRT-LLM (engine/README.md): an item's
    identifier is its uuid when the request gave one, else its digest; an adapter named by
    `lora_id` alone has the LoRA name "<decimal id>"."""
    ids = list(token_ids)
    multimodal, digests = [], {}
    for digest, offset, length, uuid in images:
        assert len(digest) == 64 and digest == digest.lower(), "a 32-byte digest in lowercase hex"
        assert length > 0 and offset + length <= len(ids)
        ids[offset] = IMAGE_DIGEST_TOKEN
        for k in range(1, length):
            ids[offset + k] = MM_TOKEN_ID_OFFSET + k
        multimodal.append((uuid or digest, offset, length))
        if uuid:
            digests[uuid] = digest
    lora_name = None if lora_id is None else str(lora_id)
    return Request(ids, block_size, lora_name=lora_name, multimodal=multimodal, mm_digests=digests)


# --- the three engines' encodings ----------------------------------------------------------


class LoopbackVllmPublisher(vllm_events.ZmqEventPublisher):
    """vLLM's publisher, unchanged except that it binds a concrete loopback endpoint (vLLM binds
    only `*`, `::` and ipc endpoints and connects to the rest; the tests never listen beyond
    127.0.0.1)."""

    @staticmethod
    def _is_bind_endpoint(endpoint):
        return True


class Vllm:
    name = "vllm"
    gpu = vllm_events.MEDIUM_GPU
    cpu = vllm_events.MEDIUM_CPU

    def __init__(self, int_hashes=True, connect=False):
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: low 64 bits as an int (maybe_convert_block_hash),
        # else the 32-byte digest itself.
        self.int_hashes = int_hashes
        # connect: vLLM's publisher exactly as shipped; with a concrete host it connects its PUB
        # (to a producer in `mode=bind`).
        self.publisher_class = vllm_events.ZmqEventPublisher if connect else LoopbackVllmPublisher

    def publisher(self, rank, endpoint, replay, buffer_steps):
        return self.publisher_class(
            data_parallel_rank=rank, endpoint=endpoint, replay_endpoint=replay, buffer_steps=buffer_steps
        )

    def engine_hash(self, digest):
        return int.from_bytes(digest, "big") & U64 if self.int_hashes else digest

    def batch(self, events):
        return vllm_events.KVEventBatch(ts=time.time(), events=events)

    def stored(self, req, first, end, parent, hashes, medium, block_size, group_idx):
        extra = [req.extra_keys(i) for i in range(first, end)]
        return vllm_events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=req.tokens[first * req.block_size : end * req.block_size],
            block_size=block_size,
            lora_id=7 if req.lora_name else None,
            medium=medium,
            lora_name=req.lora_name,
            extra_keys=extra if any(k is not None for k in extra) else None,
            group_idx=group_idx,
        )

    def removed(self, hashes, medium):
        return vllm_events.BlockRemoved(block_hashes=hashes, medium=medium, group_idx=0)

    def cleared(self):
        return vllm_events.AllBlocksCleared()


class Sglang:
    name = "sglang"
    gpu = sglang_events.StorageMedium.GPU.value
    cpu = sglang_events.StorageMedium.CPU.value  # "CPU_PINNED"

    def publisher(self, rank, endpoint, replay, buffer_steps):
        return sglang_events.ZmqEventPublisher(
            attn_dp_rank=rank, endpoint=endpoint, replay_endpoint=replay, buffer_steps=buffer_steps, bind=True
        )

    def engine_hash(self, digest):
        # SGLang publishes signed int64 hashes (half of them negative).
        return int.from_bytes(digest[:8], "big", signed=True)

    def batch(self, events):
        return sglang_events.KVEventBatch(ts=time.time(), events=events)

    def stored(self, req, first, end, parent, hashes, medium, block_size, group_idx):
        assert group_idx == 0, "SGLang events have no KV-cache group"
        return sglang_events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=req.tokens[first * req.block_size : end * req.block_size],
            block_size=block_size,
            lora_id=None,
            medium=medium,
            cache_salt=req.cache_salt,
            lora_name=req.lora_name,
        )

    def removed(self, hashes, medium):
        return sglang_events.BlockRemoved(block_hashes=hashes, medium=medium)

    def cleared(self):
        return sglang_events.AllBlocksCleared()


# TensorRT-LLM (its `kv_cache_events` module imports the TensorRT-LLM runtime, which cannot be
# installed here): its wire structs as engine/tests/fixtures/trtllm_wire.py restates them.


class TrtllmPublisher:
    """TensorRT-LLM's ZMQ publisher, restated with pyzmq: a PUB bound at the endpoint sends
    `[topic, sequence (8 bytes BE, from 0), payload]`; the sequence is reserved when a batch is
    accepted; the last `buffer_steps` batches are kept for a ROUTER bound at the replay
    endpoint, which answers `[client, "", start (8 bytes BE)]` with `[client, "", topic,
    sequence, payload]` for each buffered batch at or after `start`, then the end marker
    `[client, "", "", -1 (8 signed BE bytes), ""]` (a request of another frame count is
    ignored). A background thread does all the socket work. Rank r binds TCP port + r
    (ipc/inproc: the endpoint suffixed `_dp<r>` for r > 0). `_pub` and `_buffer` are the
    attributes the Engine wraps (DroppingPub, ForgetfulBuffer), as for vLLM's and SGLang's."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, rank, endpoint, replay_endpoint=None, buffer_steps=10_000, hwm=100_000,
                 max_queue_size=100_000, topic=""):
        import zmq

        self._zmq = zmq
        self._rank = rank
        self._topic = topic.encode("utf-8")
        self._queue = queue.Queue(maxsize=max_queue_size)
        self._buffer = collections.deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._lock = threading.Lock()
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.bind(self.rank_endpoint(endpoint, rank))
        self._replay = None
        if replay_endpoint:
            self._replay = ctx.socket(zmq.ROUTER)
            # Room for a whole replay plus its end marker.
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self._replay.bind(self.rank_endpoint(replay_endpoint, rank))
        self._encode = msgspec.msgpack.Encoder().encode
        self._running = True
        self._thread = threading.Thread(target=self._serve, daemon=True, name="trtllm-publisher")
        self._thread.start()

    @staticmethod
    def rank_endpoint(endpoint, rank):
        if rank == 0:
            return endpoint
        if endpoint.startswith(("ipc://", "inproc://")):
            return f"{endpoint}_dp{rank}"
        host, port = endpoint.rsplit(":", 1)
        return f"{host}:{int(port) + rank}"

    def publish(self, batch):
        if not self._running:
            raise RuntimeError("publisher is closed")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self._rank
        with self._lock:
            try:
                self._queue.put_nowait((self._next_seq, batch))
            except queue.Full:  # dropped; its sequence is still used (a gap)
                pass
            self._next_seq += 1

    def shutdown(self):
        self._running = False
        self._thread.join(timeout=5.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _serve(self):
        while self._running or not self._queue.empty():
            if self._replay is not None:
                while self._replay.poll(0):
                    self._answer_replay(self._replay.recv_multipart())
            try:
                seq, batch = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            payload = self._encode(batch)
            self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
            self._buffer.append((seq, payload))

    def _answer_replay(self, frames):
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            return
        client, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart([client, b"", self._topic, seq.to_bytes(8, "big"), payload])
        self._replay.send_multipart([client, b"", b"", self.END_SEQ, b""])


class Trtllm:
    name = "trtllm"
    gpu = "GPU"
    cpu = "CPU"

    def __init__(self, mm_keys=True):
        # mm_keys=False: the image blocks go out without their mm_keys (a broken publisher:
        # the digest string then names no item, the store is malformed). For failure checks.
        self.mm_keys = mm_keys

    def publisher(self, rank, endpoint, replay, buffer_steps):
        return TrtllmPublisher(rank, endpoint, replay, buffer_steps)

    def engine_hash(self, digest):
        # int64: the first 8 bytes of the block's SHA-256 key, signed.
        return int.from_bytes(digest[:8], "big", signed=True)

    def batch(self, events):
        return trtllm_wire.Batch(ts=time.time(), events=events)

    def stored(self, req, first, end, parent, hashes, medium, block_size, group_idx):
        assert req.cache_salt is None, "TensorRT-LLM events carry no cache salt"
        assert req.lora_name is None or req.lora_name.isdigit(), "TensorRT-LLM names a LoRA by lora_id"
        token_ids, mm_keys = [], []
        for index in range(first, end):
            ids, keys = req.trtllm_block(index)
            token_ids.extend(ids)
            mm_keys.append([trtllm_wire.MmKey(hash=d, start_offset=o, uuid=u) for d, o, u in keys])
        return trtllm_wire.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=token_ids,
            block_size=block_size,
            lora_id=None if req.lora_name is None else int(req.lora_name),
            medium=medium,
            lora_name=None,
            group_idx=group_idx or None,
            mm_keys=mm_keys if self.mm_keys and any(mm_keys) else None,
        )

    def removed(self, hashes, medium):
        return trtllm_wire.BlockRemoved(block_hashes=hashes, medium=medium)

    def cleared(self):
        return trtllm_wire.AllBlocksCleared()


# Older vLLM (before tagged maps): positional tagged arrays ["BlockStored", block_hashes,
# parent_block_hash, token_ids, block_size, lora_id, (medium, ...)], shorter or longer tails.
class _OldEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class OldBlockStoredShort(_OldEvent, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object


class OldBlockStored(_OldEvent, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object


class OldBlockStoredLong(_OldEvent, tag="BlockStored"):
    """Every field of vLLM 0.33's BlockStored in its order, then one a later version adds."""

    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object
    lora_name: object
    extra_keys: object
    group_idx: object
    kv_cache_spec_kind: object
    kv_cache_spec_sliding_window: object
    locality: object
    ownership: object
    session_id: object
    lookahead_token_ids: object
    future_field: object


class OldBlockRemoved(_OldEvent, tag="BlockRemoved"):
    block_hashes: list
    medium: object


class OldBlockRemovedShort(_OldEvent, tag="BlockRemoved"):
    block_hashes: list


class OldAllBlocksCleared(_OldEvent, tag="AllBlocksCleared"):
    pass


# --- socket faults (the publishers stay the real ones) ---------------------------------------


class DroppingPub:
    """Wraps a publisher's PUB socket: frames whose sequence is in `drop` are not sent (the
    publisher still buffers them for replay, as after a network loss)."""

    def __init__(self, sock):
        self._sock = sock
        self.drop = set()

    def send_multipart(self, frames, *args, **kwargs):
        if int.from_bytes(frames[1], "big") in self.drop:
            return None
        return self._sock.send_multipart(frames, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class ForgetfulBuffer(collections.deque):
    """The replay buffer, except that sequences in `forget` are never kept (a buffer that had
    already rotated them out): a replay from them cannot fill the gap."""

    forget = frozenset()

    def append(self, item):
        if item[0] not in self.forget:
            super().append(item)


def wait_port_free(port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.02)


# --- the engine: publishers per rank plus the exact model ---------------------------------


class Engine:
    def __init__(self, flavor, args, buffer_steps=10_000):
        self.flavor = flavor
        self.args = args
        self.block_size = args.block_size
        self.buffer_steps = buffer_steps
        self.ranks = list(range(args.dp_size))
        self.pubs = {}
        self.sent = {}  # rank -> batches published so far by the current publisher (= next seq)
        # rank -> engine hash -> canonical hash: exactly what the engine's GPU cache holds.
        self.cache = {rank: {} for rank in self.ranks}
        self.queries = []
        # worker id -> engine hash -> canonical: rank-0 members of other (raw) publishers.
        self.extra_members = {}
        for rank in self.ranks:
            self.start(rank)

    # publishers
    def start(self, rank):
        pub = self.flavor.publisher(rank, self.args.endpoint, self.args.replay, self.buffer_steps)
        pub._pub = DroppingPub(pub._pub)
        pub._buffer = ForgetfulBuffer(maxlen=pub._buffer.maxlen)
        self.pubs[rank] = pub
        self.sent[rank] = 0

    def publish(self, rank, events):
        self.pubs[rank].publish(self.flavor.batch(list(events)))
        self.sent[rank] += 1

    def heartbeat(self, rank):
        self.publish(rank, [])

    def lose_next(self, rank, count, replayable=True):
        """The next `count` batches of `rank` never reach the subscriber; unless `replayable`,
        the replay buffer has lost them too."""
        lost = set(range(self.sent[rank], self.sent[rank] + count))
        self.pubs[rank]._pub.drop |= lost
        if not replayable:
            self.pubs[rank]._buffer.forget = frozenset(lost)

    def restart(self, rank):
        """The engine process restarts: a new publisher on the same endpoints, sequence from 0,
        an empty cache."""
        self.stop(rank)
        self.start(rank)

    def stop(self, rank):
        """The engine process ends: its publisher and its cache are gone."""
        self.pubs[rank].shutdown()
        self.cache[rank].clear()
        # ZMQ closes the old listeners in its I/O thread, after close() returns.
        for endpoint in (self.args.endpoint, self.args.replay):
            if endpoint:
                wait_port_free(int(endpoint.rsplit(":", 1)[1]) + rank)

    def forget(self, rank, req):
        """Leaves `req`'s blocks out of the model: they left the engine's replay buffer before
        the producer could see them, so the producer cannot know them until stored again."""
        for digest in req.digests:
            self.cache[rank].pop(self.flavor.engine_hash(digest), None)

    # events (the model follows each event as the engine would have it)
    def store(self, rank, req, first=0, end=None, medium=None, block_size=None, group_idx=0):
        end = req.blocks if end is None else end
        hashes = [self.flavor.engine_hash(d) for d in req.digests[first:end]]
        parent = self.flavor.engine_hash(req.digests[first - 1]) if first > 0 else None
        medium = self.flavor.gpu if medium is None else medium
        enters = medium == self.flavor.gpu and block_size in (None, self.block_size) and group_idx == 0
        if enters:
            for h, c in zip(hashes, req.canonical[first:end]):
                self.cache[rank][h] = c
        bs = self.block_size if block_size is None else block_size
        return self.flavor.stored(req, first, end, parent, hashes, medium, bs, group_idx)

    def remove(self, rank, req, blocks, medium=None):
        hashes = [self.flavor.engine_hash(req.digests[i]) for i in blocks]
        medium = self.flavor.gpu if medium is None else medium
        if medium == self.flavor.gpu:
            for h in hashes:
                self.cache[rank].pop(h, None)
        return self.flavor.removed(hashes, medium)

    def clear(self, rank):
        self.cache[rank].clear()
        return self.flavor.cleared()

    # the model
    def members(self):
        return [
            {
                "worker_id": self.args.worker_id,
                "dp_rank": rank,
                "canonical": sorted(set(self.cache[rank].values())),
                "engine_hashes": len(self.cache[rank]),
            }
            for rank in self.ranks
        ] + [
            {"worker_id": w, "dp_rank": 0, "canonical": sorted(set(c.values())), "engine_hashes": len(c)}
            for w, c in sorted(self.extra_members.items())
        ]

    def expect(self, query):
        """Adds a token query; its expected depth is the longest run of leading blocks that some
        member caches (the lane answers for the whole pool)."""
        self.queries.append(query)

    def model(self):
        held = set()
        for cache in list(self.cache.values()) + list(self.extra_members.values()):
            held.update(cache.values())
        answers = []
        for query in self.queries:
            req = Request(
                query["token_ids"][: len(query["token_ids"]) // self.block_size * self.block_size],
                self.block_size,
                query["lora_name"] or None,
                query["cache_salt"] or None,
                [(m["identifier"], m["offset"], m["length"]) for m in query["multimodal"]],
            )
            depth = 0
            for canonical in req.canonical:
                if canonical not in held:
                    break
                depth += 1
            answers.append(dict(query, expected_depth=depth))
        return {"block_size": self.block_size, "members": self.members(), "queries": answers}

    # steps
    def ready(self, extra=(), extra_tick=None):
        probes = {}
        for rank in self.ranks:
            probe = Request([4_000_000_000 + rank] * self.block_size, self.block_size)
            probes[rank] = probe
        say(
            "READY",
            {
                "members": [
                    {"worker_id": self.args.worker_id, "dp_rank": r, "canonical": probes[r].canonical}
                    for r in self.ranks
                ]
                + list(extra)
            },
        )

        def tick():
            if extra_tick is not None:
                extra_tick()
            for rank in self.ranks:
                probe = probes[rank]
                digest = self.flavor.engine_hash(probe.digests[0])
                self.publish(
                    rank,
                    [
                        self.flavor.cleared(),
                        self.flavor.stored(probe, 0, 1, None, [digest], self.flavor.gpu, self.block_size, 0),
                    ],
                )

        wait_answer(tick)
        for rank in self.ranks:
            self.publish(rank, [self.clear(rank)])

    def check(self):
        say("CHECK", self.model())
        wait_answer()

    def emptied(self, ranks):
        say(
            "EMPTIED",
            {"members": [{"worker_id": self.args.worker_id, "dp_rank": r, "canonical": []} for r in ranks]},
        )
        wait_answer(lambda: [self.heartbeat(r) for r in ranks])

    def catchup(self):
        say("CATCHUP", self.model())
        wait_answer(lambda: [self.heartbeat(r) for r in self.ranks])

    def pause(self, name, tick=None):
        say("PAUSE", {"name": name})
        wait_answer(tick)

    def finish(self):
        model = self.model()
        pathlib.Path(self.args.out).write_text(json.dumps(model, indent=1, sort_keys=True) + "\n")
        # The publishers stay up (a last gap may still need the replay socket) until the test
        # has checked the final model.
        say("DONE")
        wait_answer()
        for pub in self.pubs.values():
            pub.shutdown()


# --- scenarios -------------------------------------------------------------------------------


def common_requests(bs):
    """A (6 blocks), B (shares A's first 2 blocks, then 3 of its own), C (3 blocks)."""
    a = Request(tokens(100, 6 * bs), bs)
    b = Request(a.tokens[: 2 * bs] + tokens(900, 3 * bs), bs)
    c = Request(tokens(5000, 3 * bs), bs)
    return a, b, c


def expect_common(e, a, b, c):
    e.expect(a.query("a"))
    e.expect(a.query("a+partial", extra_tokens=tokens(77, e.block_size - 1)))
    e.expect(a.query("a+uncached", extra_tokens=tokens(31337, e.block_size)))
    e.expect(b.query("b"))
    e.expect(c.query("c"))
    e.expect(Request(tokens(60000, 4 * e.block_size), e.block_size).query("uncached"))


def scenario_store_remove_clear(e):
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a, 0, 3)])
    e.publish(0, [e.store(0, a, 3, 6), e.store(0, b, 2, 5)])  # B reuses A's first 2 blocks
    e.publish(0, [e.store(0, c)])
    expect_common(e, a, b, c)
    e.check()
    e.publish(0, [e.remove(0, a, [4, 5]), e.remove(0, c, [1])])
    e.check()
    e.publish(0, [e.clear(0), e.store(0, c)])
    e.check()
    e.publish(0, [e.store(0, a, 0, 4)])


def scenario_two_ranks(e):
    assert len(e.ranks) == 2, "--dp-size 2"
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a)])
    e.publish(1, [e.store(1, a, 0, 2), e.store(1, b, 2, 5)])
    e.publish(1, [e.store(1, c)])
    expect_common(e, a, b, c)
    e.check()
    # Rank 1 evicts A's prefix: rank 0 still holds it, so A's depth is unchanged.
    e.publish(1, [e.remove(1, a, [0, 1])])
    e.publish(0, [e.remove(0, a, [5])])
    e.check()
    e.publish(1, [e.clear(1)])


def scenario_gap_replay(e):
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a, 0, 2)])
    e.lose_next(0, 3)
    e.publish(0, [e.store(0, a, 2, 6)])
    e.publish(0, [e.store(0, b, 2, 5)])
    e.publish(0, [e.remove(0, a, [5])])
    # The next batch shows the gap; the producer asks the replay socket for the three lost.
    e.publish(0, [e.store(0, c)])
    expect_common(e, a, b, c)
    e.check()
    # A second gap, right after the first was filled.
    e.lose_next(0, 1)
    e.publish(0, [e.remove(0, c, [2])])
    e.publish(0, [])


def scenario_gap_unfilled(e):
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a)])
    e.check()
    e.lose_next(0, 2, replayable=False)
    e.publish(0, [e.store(0, b, 2, 5)])
    e.publish(0, [e.remove(0, a, [3])])
    # The producer cannot know what the lost batches did: it clears the member on its own...
    e.clear(0)
    e.emptied([0])
    # ... and what the engine stores later comes back.
    e.publish(0, [e.store(0, c)])
    expect_common(e, a, b, c)


def scenario_restart(e):
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    # Enough batches that the new publisher's sequence (from 0) is surely behind the old one's,
    # whatever the new one loses before the subscriber reconnects.
    for _ in range(300):
        e.heartbeat(0)
    expect_common(e, a, b, c)
    e.check()
    e.restart(0)
    e.emptied([0])
    e.publish(0, [e.store(0, c)])
    e.publish(0, [e.store(0, a, 0, 2)])


def scenario_lora(e):
    bs = e.block_size
    image = "0123456789abcdef" + "fedcba9876543210" * 3  # a vLLM multimodal hash (hex digest)
    base = tokens(300, 6 * bs)
    lora = Request(base, bs, lora_name="sql-lora")
    salted = Request(base, bs, lora_name="sql-lora", cache_salt="tenant-a")
    mm = Request(tokens(700, 5 * bs), bs, multimodal=[(image, bs + 1, 2 * bs)])
    plain = Request(base[: 2 * bs], bs)
    e.ready()
    e.publish(0, [e.store(0, lora, 0, 3), e.store(0, salted, 0, 2)])
    # Continuations: later blocks carry no salt in their extra keys (vLLM puts it on the
    # request's first block only); the salt still scopes them, through the parent.
    e.publish(0, [e.store(0, lora, 3, 6), e.store(0, salted, 2, 4)])
    e.publish(0, [e.store(0, mm)])
    e.expect(lora.query("lora"))
    e.expect(lora.query("lora-name-missing", lora_name=""))
    e.expect(lora.query("other-lora", lora_name="other"))
    e.expect(salted.query("lora+salt", blocks=6))
    e.expect(salted.query("lora+wrong-salt", cache_salt="tenant-b"))
    e.expect(mm.query("multimodal"))
    e.expect(Request(mm.tokens, bs).query("multimodal-tokens-without-image"))
    e.expect(plain.query("no-lora"))
    e.check()
    e.publish(0, [e.remove(0, lora, [4, 5]), e.remove(0, salted, [0])])


def scenario_bytes_hashes(e):
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    e.publish(0, [e.store(0, c)])
    expect_common(e, a, b, c)
    e.check()
    e.publish(0, [e.remove(0, a, [3, 4, 5]), e.remove(0, b, [4])])


def scenario_cpu_tier(e):
    bs = e.block_size
    a, b, c = common_requests(bs)
    d = Request(tokens(8000, 4 * bs), bs)
    wide = Request(tokens(9000, 4 * bs), 2 * bs)  # blocks of twice the configured size
    e.ready()
    e.publish(0, [e.store(0, a)])
    # The offloading tier reports copies of A's blocks (same engine hashes) and B, on CPU.
    e.publish(0, [e.store(0, a, 0, 4, medium=e.flavor.cpu), e.store(0, b, 2, 5, medium=e.flavor.cpu)])
    e.publish(0, [e.store(0, c, medium=e.flavor.cpu)])
    # A non-main KV-cache group, and a block size the producer is not configured for.
    if e.flavor.name == "vllm":
        e.publish(0, [e.store(0, d, group_idx=1)])
    e.publish(0, [e.store(0, wide, block_size=2 * bs)])
    expect_common(e, a, b, c)
    e.expect(d.query("other-group"))
    e.expect(Request(wide.tokens, bs).query("other-block-size"))
    e.check()
    # Evicting the CPU copies leaves the GPU blocks alone; a GPU eviction does not.
    e.publish(0, [e.remove(0, a, [0, 1, 2, 3], medium=e.flavor.cpu)])
    e.check()
    e.publish(0, [e.remove(0, a, [5])])


def scenario_positional(e):
    """Older vLLM: positional tagged arrays with shorter and longer tails, through the real
    publisher and batch (the batch itself is positional in every version)."""
    a, b, c = common_requests(e.block_size)
    h = e.flavor.engine_hash

    def old_stored(req, first, end, cls):
        e.store(0, req, first, end)  # the model
        fields = dict(
            block_hashes=[h(d) for d in req.digests[first:end]],
            parent_block_hash=h(req.digests[first - 1]) if first else None,
            token_ids=req.tokens[first * req.block_size : end * req.block_size],
            block_size=e.block_size,
            lora_id=None,
        )
        if cls is not OldBlockStoredShort:
            fields["medium"] = "GPU"
        if cls is OldBlockStoredLong:
            fields.update(
                lora_name=None,
                extra_keys=None,
                group_idx=0,
                kv_cache_spec_kind=None,
                kv_cache_spec_sliding_window=None,
                locality="LOCAL",
                ownership=None,
                session_id="session-1",
                lookahead_token_ids=None,
                future_field=[1, 2, 3],
            )
        return cls(**fields)

    def old_removed(req, blocks, cls):
        e.remove(0, req, blocks)
        hashes = [h(req.digests[i]) for i in blocks]
        return cls(block_hashes=hashes, medium="GPU") if cls is OldBlockRemoved else cls(block_hashes=hashes)

    e.ready()
    e.publish(0, [old_stored(a, 0, 3, OldBlockStoredShort), old_stored(a, 3, 6, OldBlockStored)])
    e.publish(0, [old_stored(b, 2, 5, OldBlockStoredLong), old_stored(c, 0, 3, OldBlockStored)])
    expect_common(e, a, b, c)
    e.check()
    e.publish(0, [old_removed(a, [5], OldBlockRemovedShort), old_removed(b, [3, 4], OldBlockRemoved)])
    e.check()
    e.clear(0)
    e.publish(0, [OldAllBlocksCleared(), old_stored(c, 0, 2, OldBlockStored)])


def scenario_sglang(e):
    """SGLang: signed int64 hashes (negative ones included), cache_salt on every store of a
    request, LoRA name, a CPU_PINNED tier."""
    bs = e.block_size
    salted = Request(tokens(1200, 6 * bs), bs, cache_salt="tenant-a")
    lora = Request(tokens(2400, 3 * bs), bs, lora_name="sg-lora")
    a, b, c = common_requests(bs)
    negative = [d for r in (salted, lora, a, b, c) for d in r.digests if e.flavor.engine_hash(d) < 0]
    assert negative, "the scenario must publish negative int64 hashes"
    e.ready()
    e.publish(0, [e.store(0, salted, 0, 4), e.store(0, lora)])
    e.publish(0, [e.store(0, salted, 4, 6), e.store(0, a), e.store(0, b, 2, 5)])
    e.publish(0, [e.store(0, c, medium=e.flavor.cpu)])
    expect_common(e, a, b, c)
    e.expect(salted.query("salted"))
    e.expect(salted.query("salt-missing", cache_salt=""))
    e.expect(lora.query("lora"))
    e.check()
    e.publish(0, [e.remove(0, salted, [3, 4, 5]), e.remove(0, a, [1]), e.remove(0, c, [0], medium=e.flavor.cpu)])
    e.check()
    e.publish(0, [e.clear(0), e.store(0, lora, 0, 2)])


def scenario_trtllm(e):
    """TensorRT-LLM's format: a plain request; a request whose image starts mid-block (its
    digest string in place of the first token id, `mm_keys` on every block it spans); an image
    named by a uuid; a LoRA named by `lora_id` alone. Two of those stores are lost on the way
    and come back through the replay socket; removals; a gap over a clear and stores again.
    Queries: the image's blocks only with the image (named by its digest, or its uuid), the
    LoRA's blocks only with the adapter "7"."""
    bs = e.block_size
    image = hashlib.sha256(b"trtllm-image-1").hexdigest()
    photo = hashlib.sha256(b"trtllm-image-2").hexdigest()
    plain = Request(tokens(1500, 4 * bs), bs)
    # The image at positions bs+2 .. 3bs+1: it starts in block 1 and spans blocks 1, 2 and 3.
    pictured = trtllm_request(tokens(2500, 5 * bs), bs, images=[(image, bs + 2, 2 * bs, None)])
    tagged = trtllm_request(tokens(3500, 3 * bs), bs, images=[(photo, 1, bs, "user-photo-9")])
    lora = trtllm_request(tokens(4500, 3 * bs), bs, lora_id=7)
    assert pictured.tokens[bs + 2] == IMAGE_DIGEST_TOKEN and lora.lora_name == "7"
    e.ready()
    e.publish(0, [e.store(0, plain, 0, 2), e.store(0, lora)])
    # Lost live, filled from the replay socket: the image store among them.
    e.lose_next(0, 2)
    e.publish(0, [e.store(0, pictured)])
    e.publish(0, [e.store(0, plain, 2, 4)])
    e.publish(0, [e.store(0, tagged)])  # shows the gap
    e.expect(plain.query("plain"))
    e.expect(pictured.query("image"))
    e.expect(pictured.query("image+uncached", extra_tokens=tokens(31337, bs)))
    e.expect(Request(pictured.tokens, bs).query("image-tokens-without-the-image"))
    other = hashlib.sha256(b"another-image").hexdigest()
    e.expect(Request(pictured.tokens, bs, multimodal=[(other, bs + 2, 2 * bs)]).query("another-image"))
    pad = list(pictured.tokens)
    pad[bs + 2] = 151655  # an image placeholder token id instead of IMAGE_DIGEST_TOKEN
    e.expect(Request(pad, bs, multimodal=pictured.multimodal).query("image-without-the-digest-token"))
    e.expect(tagged.query("image-by-uuid"))
    e.expect(Request(tagged.tokens, bs, multimodal=[(photo, 1, bs)]).query("uuid-image-by-its-digest"))
    e.expect(lora.query("lora-id"))
    e.expect(lora.query("lora-missing", lora_name=""))
    e.expect(lora.query("lora-other", lora_name="8"))
    e.check()
    e.publish(0, [e.remove(0, pictured, [3, 4]), e.remove(0, lora, [2])])
    e.check()
    # A second gap: a clear and the image again, lost live.
    e.lose_next(0, 1)
    e.publish(0, [e.clear(0), e.store(0, pictured, 0, 3)])
    e.publish(0, [e.store(0, lora, 0, 2)])
    e.check()
    e.publish(0, [e.store(0, tagged)])


def downtime_after_a(e):
    """A stored and checked; the producer is killed; the engine stores B and evicts one of A's
    blocks while it is down (only its replay buffer has them); the producer restarts. Returns C
    (not stored yet)."""
    a, b, c = common_requests(e.block_size)
    expect_common(e, a, b, c)
    e.ready()
    e.publish(0, [e.store(0, a)])
    e.check()
    e.pause("kill")
    e.publish(0, [e.store(0, b, 2, 5)])
    e.publish(0, [e.remove(0, a, [5])])
    e.pause("restart")
    return c


def scenario_resume_replay(e):
    """downtime_after_a, then C live: the restarted producer resumes after its journaled
    sequence and gets the downtime from the replay socket."""
    c = downtime_after_a(e)
    e.publish(0, [e.store(0, c)])
    e.catchup()


def scenario_resume_idle(e):
    """downtime_after_a, then nothing: the engine is idle, so the producer must ask the replay
    socket for the downtime itself (a CHECK without heartbeats)."""
    downtime_after_a(e)
    e.check()


def scenario_resume_engine_restart(e):
    """The engine restarts while the producer is down (its sequence starts over, its cache is
    empty): the restarted producer restores A and B, then clears them on the new engine's first
    batch, and tracks only what the new engine stores."""
    a, b, c = common_requests(e.block_size)
    expect_common(e, a, b, c)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    # Enough batches that the new publisher's sequence (from 0) is surely behind the old one's.
    for _ in range(300):
        e.heartbeat(0)
    e.check()
    e.pause("kill")
    e.restart(0)
    e.pause("restart")
    e.emptied([0])
    e.publish(0, [e.store(0, c)])
    e.check()


def restart_at(e, delta):
    """The engine restarts; the new process stores C and A's first two blocks, then publishes
    heartbeats up to the old process's last sequence + `delta` (-1: below it, 0: equal, 3:
    above), all before the producer's SUB socket is back, and stays idle: the producer must see
    the new process whatever sequence it reached, and hold exactly what it stored (a CHECK with
    no live batch after)."""
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    for _ in range(20):
        e.heartbeat(0)
    expect_common(e, a, b, c)
    e.check()
    last = e.sent[0] - 1
    e.restart(0)
    e.publish(0, [e.store(0, c)])
    e.publish(0, [e.store(0, a, 0, 2)])
    while e.sent[0] - 1 < last + delta:
        e.heartbeat(0)
    e.check()


OUTAGE_S = 6.0


def scenario_outage(e):
    """The engine process is gone for OUTAGE_S seconds (its cache with it), then a new one
    stores a new request every 50 ms: the test measures, between PAUSE up and its answer, that
    the producer reconnected within a second; the producer then holds exactly the new process's
    stores, those published before its reconnection included."""
    bs = e.block_size
    a, b, c = common_requests(bs)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    expect_common(e, a, b, c)
    e.check()
    e.stop(0)
    e.pause("down")
    time.sleep(OUTAGE_S)
    e.start(0)
    stream = iter(Request(tokens(200_000 + 1_000 * i, 2 * bs), bs) for i in range(100_000))

    def store_one():
        req = next(stream)
        e.publish(0, [e.store(0, req)])
        if len(e.queries) < 12:
            e.expect(req.query(f"after-outage-{len(e.queries)}"))

    e.pause("up", tick=store_one)
    for _ in range(20):
        store_one()
        time.sleep(0.02)
    e.check()


def scenario_stall(e):
    """The engine process stops (the test sends SIGSTOP at PAUSE stall) long enough for the
    producer's check of it to time out and clear its member; once it runs again, with nothing
    new published, the producer re-reads its buffer and holds exactly what it held before."""
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    expect_common(e, a, b, c)
    e.check()
    e.pause("stall")
    e.check()


def late_history(e):
    """What an engine publishes before any producer runs: A, a 40-block chain in 8 stores, B,
    one of A's blocks evicted. Returns C (not stored)."""
    bs = e.block_size
    a, b, c = common_requests(bs)
    chain = Request(tokens(30_000, 40 * bs), bs)
    e.publish(0, [e.store(0, a)])
    for k in range(8):
        e.publish(0, [e.store(0, chain, 5 * k, 5 * k + 5)])
    e.publish(0, [e.store(0, b, 2, 5)])
    e.publish(0, [e.remove(0, a, [5])])
    expect_common(e, a, b, c)
    e.expect(chain.query("chain"))
    e.expect(chain.query("chain-prefix", blocks=17))
    return c


def scenario_late_producer(e):
    """The producer starts after the engine published (PAUSE start): its first contact re-reads
    the engine's replay buffer, so it holds everything with no live batch after; then C live."""
    c = late_history(e)
    e.pause("start")
    e.check()
    e.publish(0, [e.store(0, c)])
    e.check()


def scenario_late_producer_past_buffer(e):
    """As late_producer, with a replay buffer of 4 batches: X (stored first) has left it by
    the time the producer starts, so the producer cannot know X (the model leaves it out); the
    rest of the history is still in the buffer and found."""
    bs = e.block_size
    x = Request(tokens(65_000, 3 * bs), bs)
    a, b, c = common_requests(bs)
    d = Request(tokens(70_000, 2 * bs), bs)
    e.publish(0, [e.store(0, x)])
    for _ in range(3):
        e.heartbeat(0)
    e.publish(0, [e.store(0, a)])
    e.publish(0, [e.store(0, b, 2, 5)])
    e.publish(0, [e.store(0, d)])
    e.publish(0, [e.remove(0, a, [5])])
    expect_common(e, a, b, c)
    e.expect(x.query("evicted-from-the-buffer"))
    e.expect(d.query("d"))
    e.forget(0, x)
    e.pause("start")
    e.check()


def scenario_shared_restart(e):
    """One of two engines of the DC storing the same tokens: it restarts and stores C; the other
    engine's member (another driver) keeps A and B. No token queries: the lane answers for both."""
    a, b, c = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    e.check()
    e.restart(0)
    e.publish(0, [e.store(0, c)])
    e.check()


def scenario_shared_steady(e):
    """The other engine: stores A and B, and keeps them through the first one's restart."""
    a, b, _ = common_requests(e.block_size)
    e.ready()
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    e.check()
    for _ in range(40):
        e.heartbeat(0)
        time.sleep(0.05)
    e.check()


def churn(e, restart_engine):
    """The engine stores a new request every 50 ms (a removal of an older one every fourth
    time) while the producer is killed with -9 (PAUSE kill) and started again on its journal
    (PAUSE restart); with `restart_engine`, the engine also restarts while the producer is
    down. The producer must then hold exactly what the engine holds."""
    bs = e.block_size
    e.ready()
    stream = iter(Request(tokens(300_000 + 1_000 * i, 2 * bs), bs) for i in range(100_000))
    stored = []

    def step():
        req = next(stream)
        events = [e.store(0, req)]
        stored.append(req)
        if len(stored) % 4 == 0:
            old = stored.pop(0)
            events.append(e.remove(0, old, [1]))
        e.publish(0, events)
        if len(e.queries) < 8:
            e.expect(req.query(f"churn-{len(e.queries)}"))

    for _ in range(10):
        step()
    e.check()
    e.pause("kill", tick=step)
    if restart_engine:
        e.restart(0)
        stored.clear()
    e.pause("restart", tick=step)
    for _ in range(10):
        step()
        time.sleep(0.02)
    e.check()


class RawPublisher:
    """A bare pyzmq PUB, no engine code: sends whatever payload it is given as
    `[topic, sequence, payload]`, sequences in order from 0. Nothing is ever dropped on the
    way out (no high-water mark), so the producer sees every frame."""

    def __init__(self, endpoint):
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.bind(endpoint)
        self.seq = 0

    def send(self, payload, sequence=None):
        sequence = self.seq.to_bytes(8, "big") if sequence is None else sequence
        self.sock.send_multipart([b"", sequence, payload], copy=False)
        self.seq += 1

    def close(self):
        self.sock.close(linger=2000)


def scenario_malformed(e):
    """A well-behaved vLLM publisher (worker --worker-id) beside a raw PUB (worker
    --bad-worker) that sends truncated msgpack, wrong types, a bad sequence frame, a 100 MB frame
    and a flood of 100k unknown event types, then one valid store: the producer must keep both
    members exact."""
    assert e.args.bad_endpoint and e.args.bad_worker is not None, "--bad-endpoint, --bad-worker"
    bs = e.block_size
    encode = msgspec.msgpack.Encoder().encode
    bad = RawPublisher(e.args.bad_endpoint)
    e.extra_members[e.args.bad_worker] = {}
    a, b, c = common_requests(bs)
    d = Request(tokens(11000, 3 * bs), bs)
    probe = Request([4_100_000_000] * bs, bs)

    def bad_batch(events):
        return encode(vllm_events.KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))

    def bad_store(req):
        hashes = [e.flavor.engine_hash(x) for x in req.digests]
        return e.flavor.stored(req, 0, req.blocks, None, hashes, e.flavor.gpu, bs, 0)

    e.ready(
        extra=[{"worker_id": e.args.bad_worker, "dp_rank": 0, "canonical": probe.canonical}],
        extra_tick=lambda: bad.send(bad_batch([vllm_events.AllBlocksCleared(), bad_store(probe)])),
    )
    bad.send(bad_batch([vllm_events.AllBlocksCleared()]))
    e.publish(0, [e.store(0, a), e.store(0, b, 2, 5)])
    expect_common(e, a, b, c)
    e.check()

    valid = bad_batch([bad_store(c)])
    garbage = [
        valid[: len(valid) // 2],  # truncated
        valid[:1],
        b"\xc1",  # a byte msgpack never uses
        encode("a string, not a batch"),
        encode(42),
        encode([1.0, "events should be a list", 0]),
        encode({"ts": "not a number", "events": None}),
        encode([1.0, [{"type": "BlockStored", "block_hashes": "not a list", "parent_block_hash": None,
                        "token_ids": [1, 2, 3, 4], "block_size": bs, "lora_id": None, "medium": "GPU"}], 0]),
        encode([1.0, [{"type": "BlockStored", "block_hashes": [1.5], "parent_block_hash": None,
                        "token_ids": ["x"] * bs, "block_size": -4, "lora_id": None, "medium": 3}], 0]),
        encode([1.0, [{"type": "BlockRemoved", "block_hashes": [{"a": 1}], "medium": "GPU"}, 17, None], "rank"]),
        encode([1.0, [["BlockStored"], ["BlockRemoved", "x"], []], 0]),
    ]
    for payload in garbage:
        bad.send(payload)
    bad.send(valid, sequence=b"\x00\x01")  # a sequence frame that is not 8 bytes
    bad.seq -= 1  # that frame carried no sequence
    bad.send(b"\xc1" * (100 << 20))  # 100 MB
    for chunk in range(10):
        flood = [{"type": "FutureKvEvent", "n": chunk * 10_000 + i, "payload": [i]} for i in range(10_000)]
        bad.send(encode([time.time(), flood, 0]))
    # Still listening after all of it: a valid store of the bad worker.
    bad.send(bad_batch([bad_store(d)]))
    e.extra_members[e.args.bad_worker] = {x: y for x, y in zip(d.digests, d.canonical)}
    e.publish(0, [e.store(0, c)])
    e.expect(d.query("bad-worker-valid-store"))
    e.check()
    bad.close()


SCENARIOS = {
    "store_remove_clear": (Vllm, scenario_store_remove_clear, {}),
    "two_ranks": (Vllm, scenario_two_ranks, {}),
    "connect": (lambda: Vllm(connect=True), scenario_store_remove_clear, {}),
    "gap_replay": (Vllm, scenario_gap_replay, {}),
    "gap_unfilled": (Vllm, scenario_gap_unfilled, {}),
    "restart": (Vllm, scenario_restart, {}),
    "lora": (Vllm, scenario_lora, {}),
    "bytes_hashes": (lambda: Vllm(int_hashes=False), scenario_bytes_hashes, {}),
    "cpu_tier": (Vllm, scenario_cpu_tier, {}),
    "sglang_cpu_tier": (Sglang, scenario_cpu_tier, {}),
    "positional": (Vllm, scenario_positional, {}),
    "sglang": (Sglang, scenario_sglang, {}),
    "malformed": (Vllm, scenario_malformed, {}),
    "stall": (Vllm, scenario_stall, {}),
    "resume_replay": (Vllm, scenario_resume_replay, {}),
    "resume_engine_restart": (Vllm, scenario_resume_engine_restart, {}),
    "resume_idle": (Vllm, scenario_resume_idle, {}),
    "sglang_resume_idle": (Sglang, scenario_resume_idle, {}),
    "sglang_resume_replay": (Sglang, scenario_resume_replay, {}),
    "restart_below": (Vllm, lambda e: restart_at(e, -1), {}),
    "restart_equal": (Vllm, lambda e: restart_at(e, 0), {}),
    "restart_above": (Vllm, lambda e: restart_at(e, 3), {}),
    "sglang_restart_equal": (Sglang, lambda e: restart_at(e, 0), {}),
    "outage": (Vllm, scenario_outage, {}),
    "late_producer": (Vllm, scenario_late_producer, {}),
    "sglang_late_producer": (Sglang, scenario_late_producer, {}),
    "late_producer_past_buffer": (Vllm, scenario_late_producer_past_buffer, {"buffer_steps": 4}),
    "shared_restart": (Vllm, scenario_shared_restart, {}),
    "churn_kill": (Vllm, lambda e: churn(e, False), {}),
    "churn_kill_engine_restart": (Vllm, lambda e: churn(e, True), {}),
    "sglang_shared_steady": (Sglang, scenario_shared_steady, {}),
    "trtllm": (Trtllm, scenario_trtllm, {}),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--endpoint", required=True, help="rank 0's PUB endpoint, tcp://127.0.0.1:P")
    parser.add_argument("--replay", default=None, help="rank 0's replay (ROUTER) endpoint")
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--bad-endpoint", default=None, help="malformed: the raw PUB's endpoint")
    parser.add_argument("--bad-worker", type=int, default=None, help="malformed: its worker id")
    parser.add_argument("--out", required=True, help="where to write the final model (JSON)")
    args = parser.parse_args()
    make, run, options = SCENARIOS[args.scenario]
    engine = Engine(make(), args, **options)
    run(engine)
    engine.finish()


if __name__ == "__main__":
    main()
