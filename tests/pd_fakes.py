"""Fake producer/consumer pairs for the P→D arm's engine-free tests (NIXL needs a CUDA GPU; these stand in for it).

The fakes keep what the arm's logic depends on and nothing else. A producer prefills a request into blocks of
`block_size` tokens taken from its free list (last freed, first taken, as a free queue hands back blocks just
released), holds them until the consumer has read them, then frees them: their content stays until they are taken
again. A consumer reads the blocks a reference names, whatever they now hold (a pull by block ID, as NIXL reads),
counts them as external tokens, and "answers from its KV": the answer is a fixed function of the tokens its KV was
computed from (every position but the last, which it computes itself), so KV of another prompt gives that prompt's
answer. Its own prefix cache (whole blocks, the last token never a hit) serves the partial-hit case.

  TransferringPair  transfers as it should
  RePrefillPair     the consumer ignores the reference and prefills itself: no external tokens (vLLM #26896)
  ForeignBlocksPair the producer hands over the previous request's blocks (fresh blocks per request, so those
                    still hold the previous prompt's KV)

A reference naming blocks the producer never had (the out-of-range control) meets the consumer's `bad_ids`:
  "refuse"    a failed transfer counted and the request refused (HTTP 500): what the kit predicts of vLLM 0.26.0
  "silent"    the read goes ahead over whatever lies there (zeros here): HTTP 200, wrong, no failure counted
  "reported"  as silent, but the failed transfer counted (HTTP 200, wrong, the failure in the metrics)
  "recompute" the failed transfer counted and the consumer prefills itself: the right answer, nothing loaded
"""

from __future__ import annotations

import hashlib

from repro.disagg.pair import Answer
from repro.judge.pd_verdict import Transfer

VOCAB = 1000


def kv_digest(context: tuple[int, ...]) -> str:
    """The fake KV of a block: a digest of every token up to its end (a position's KV depends on all before it)."""
    return hashlib.sha256(repr(tuple(context)).encode()).hexdigest()[:16]


def reference_blocks(prompt: tuple[int, ...], block_size: int) -> tuple[str, ...]:
    return tuple(kv_digest(prompt[:end]) for end in range(block_size, len(prompt) + 1, block_size))


def answer_from_kv(context: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """The fake model's greedy answer: a fixed function of the KV's tokens (all positions but the last)."""
    seed = hashlib.sha256(repr(context[:-1]).encode()).digest()
    out, block = [], seed
    while len(out) < max_tokens:
        block = hashlib.sha256(block).digest()
        out += [int.from_bytes(block[i : i + 2], "big") % VOCAB for i in range(0, 32, 2)]
    return tuple(out[:max_tokens])


class FakeProducer:
    def __init__(self, block_size: int, fresh_blocks: bool = False):
        self.block_size, self.fresh = block_size, fresh_blocks
        self.blocks: dict[int, tuple[int, ...]] = {}
        self.kv: dict[int, str] = {}  # each block's fake KV digest (full blocks)
        self.free: list[int] = []
        self.held: dict[str, list[int]] = {}
        self.next_id = 0
        self.last: tuple[list[int], int] | None = None

    def _take(self) -> int:
        if self.free and not self.fresh:
            return self.free.pop()
        self.next_id += 1
        return self.next_id

    def prefill(self, request_id: str, prompt: tuple[int, ...]) -> dict:
        bs = self.block_size
        ids = [self._take() for _ in range(0, len(prompt), bs)]
        for i, b in enumerate(ids):
            self.blocks[b] = prompt[i * bs : (i + 1) * bs]
            self.kv[b] = kv_digest(prompt[: (i + 1) * bs])
        self.held[request_id] = ids
        return self.reference(request_id, ids, len(prompt))

    def reference(self, request_id: str, ids: list[int], tokens: int) -> dict:
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(ids)],
            "remote_engine_id": "fake-producer",
            "remote_request_id": request_id,
            "remote_host": "127.0.0.1",
            "remote_port": 1,
            "remote_num_tokens": tokens,
        }

    def read(self, ids: list[int]) -> list[tuple[int, ...]]:
        return [self.blocks.get(b, (0,) * self.block_size) for b in ids]

    def has(self, ids: list[int]) -> bool:
        return all(b in self.blocks for b in ids)

    def notify(self, request_id: str) -> None:
        """The consumer has read the request's blocks: free them (reversed, so the first is taken first again)."""
        self.free += reversed(self.held.pop(request_id, []))


class ForeignProducer(FakeProducer):
    """Hands over the blocks of the request it prefilled before this one."""

    def prefill(self, request_id: str, prompt: tuple[int, ...]) -> dict:
        params = super().prefill(request_id, prompt)
        mine = (params["remote_block_ids"][0], request_id)
        given = self.last or mine
        self.last = mine
        return self.reference(given[1], given[0], len(prompt))


class FakeConsumer:
    def __init__(
        self, producer: FakeProducer, block_size: int, pulls: bool = True, bad_ids: str = "refuse", audit: bool = False
    ):
        self.producer, self.block_size, self.pulls, self.bad_ids = producer, block_size, pulls, bad_ids
        self.audit = audit
        self.cache: set[tuple[int, ...]] = set()

    def local_hit(self, prompt: tuple[int, ...]) -> int:
        bs, hit = self.block_size, 0
        while hit + bs <= len(prompt) - 1 and prompt[: hit + bs] in self.cache:
            hit += bs
        return hit

    def decode(self, request_id: str, prompt: tuple[int, ...], params: dict | None, max_tokens: int) -> Answer:
        bs, local = self.block_size, self.local_hit(prompt)
        kv, external, transfers, received = list(prompt), 0, 0, []
        if self.pulls and params and params.get("do_remote_prefill") and params.get("remote_block_ids"):
            count = min(params.get("remote_num_tokens") or 0, len(prompt)) - local
            ids = params["remote_block_ids"][0][local // bs :]
            if count > 0 and not self.producer.has(ids) and self.bad_ids != "silent":
                failed = Transfer(0, local, local, 0, 1)
                if self.bad_ids == "refuse":
                    return Answer(None, failed, "consumer answered HTTP 500: KV load failed")
                if self.bad_ids == "recompute":
                    return Answer(answer_from_kv(prompt, max_tokens), failed, None, local)
                kv[local : local + count] = [0] * count
                zeros = [kv_digest((0,) * bs)] * ((local + count) // bs - local // bs) if self.audit else None
                return Answer(answer_from_kv(tuple(kv), max_tokens), Transfer(count, local, local + count, 0, 1),
                              kv_blocks=tuple(zeros) if zeros is not None else None, kv_first_slot=local // bs)  # fmt: skip
            if count > 0:
                loaded = [t for chunk in self.producer.read(ids) for t in chunk]
                kv[local : local + count] = loaded[:count]
                external, transfers = count, 1
                full = (local + count) // bs - local // bs
                received = [self.producer.kv.get(b) or kv_digest((0,) * bs) for b in ids[:full]]
            self.producer.notify(params["remote_request_id"])
        for end in range(bs, len(prompt) + 1, bs):
            self.cache.add(prompt[:end])
        transfer = Transfer(external, local, local + external, transfers, 0)
        blocks = tuple(received) if self.audit else None
        return Answer(answer_from_kv(tuple(kv), max_tokens), transfer, None, local + external, kv_blocks=blocks,
                      kv_first_slot=local // bs)  # fmt: skip


class FakePair:
    """A PairDriver over a fake producer and consumer; the reference is the fake model on the prompt itself."""

    def __init__(
        self,
        block_size: int,
        producer: FakeProducer | None = None,
        pulls: bool = True,
        bad_ids: str = "refuse",
        audit: bool = False,
    ):
        self.producer, self.block_size, self.audit = producer or FakeProducer(block_size), block_size, audit
        self.consumer = FakeConsumer(self.producer, block_size, pulls, bad_ids, audit)
        self.sent: list[tuple[str, str]] = []

    def baseline(self, request_id: str, prompt: tuple[int, ...], max_tokens: int) -> Answer:
        blocks = reference_blocks(prompt, self.block_size) if self.audit else None
        return Answer(answer_from_kv(prompt, max_tokens), None, None, 0, kv_blocks=blocks)

    def reset(self) -> None:
        self.consumer.cache.clear()

    def prefill(self, request_id: str, prompt: tuple[int, ...]) -> dict:
        self.sent.append(("prefill", request_id))
        return self.producer.prefill(request_id, prompt)

    def decode(self, request_id: str, prompt: tuple[int, ...], params: dict | None, max_tokens: int) -> Answer:
        self.sent.append(("decode", request_id))
        return self.consumer.decode(request_id, prompt, params, max_tokens)


def transferring_pair(block_size: int) -> FakePair:
    return FakePair(block_size)


def re_prefill_pair(block_size: int) -> FakePair:
    return FakePair(block_size, pulls=False)


def foreign_blocks_pair(block_size: int) -> FakePair:
    return FakePair(block_size, ForeignProducer(block_size, fresh_blocks=True))


def bad_ids_pair(bad_ids: str):
    """A transferring pair whose consumer meets blocks the producer never had as `bad_ids` says."""
    return lambda block_size: FakePair(block_size, bad_ids=bad_ids)


def audited_pair(make=None, **kwargs):
    """A fake pair with the consumer's KV audit on: the reference's blocks and the received ones as digests."""

    def build(block_size: int) -> FakePair:
        pair = make(block_size) if make is not None else FakePair(block_size, **kwargs)
        pair.audit = pair.consumer.audit = True
        return pair

    return build
