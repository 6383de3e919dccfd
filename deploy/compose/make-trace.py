#!/usr/bin/env python3
"""Writes the compose stack's sample trace (traces/sample.jsonl), deterministically.

A small multi-turn chat workload in the Mooncake JSONL format (one request a line: `timestamp`
ms, `input_length` and `output_length` tokens, `hash_ids` = 512-token prefix-block ids, as
Mooncake's published traces). It is synthetic (generated here, no real traffic):

- a few system prompts of 3-6 blocks, each shared by many sessions;
- sessions: the first turn is a system prompt plus 4-12 new blocks, every later turn repeats
  the whole previous request and appends 2-8 new blocks (the conversation so far);
- turns of different sessions interleave, timestamps increase.

So prefixes are shared across sessions (system prompts) and within a session (its history),
which is what prefix-aware routing exploits. The same seed always gives the same file.

Usage: make-trace.py [--seed N] [--sessions N] [OUT]   (default OUT: traces/sample.jsonl)
"""

import argparse
import json
import os
import random


def generate(seed: int, sessions: int):
    rng = random.Random(seed)
    next_id = 0

    def fresh(n):
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    prompts = [fresh(rng.randint(3, 6)) for _ in range(4)]
    # Each session: remaining turns and its current context (None before its first turn).
    live = [[rng.randint(3, 10), None] for _ in range(sessions)]
    t = 0
    while live:
        s = rng.randrange(len(live))
        turns, ctx = live[s]
        ids = (rng.choice(prompts) + fresh(rng.randint(4, 12))) if ctx is None else (ctx + fresh(rng.randint(2, 8)))
        yield {
            "timestamp": t,
            "input_length": len(ids) * 512 - rng.randint(0, 511),
            "output_length": rng.randint(50, 800),
            "hash_ids": ids,
        }
        t += rng.randint(0, 200)
        if turns == 1:
            live.pop(s)
        else:
            live[s] = [turns - 1, ids]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("out", nargs="?", default=os.path.join(here, "traces", "sample.jsonl"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    n = 0
    with open(args.out, "w") as f:
        for req in generate(args.seed, args.sessions):
            f.write(json.dumps(req, separators=(", ", ": ")) + "\n")
            n += 1
    print(f"wrote {n} requests to {args.out}")


if __name__ == "__main__":
    main()
