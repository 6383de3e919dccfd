#!/usr/bin/env python3
"""Worked example: drive ckf-relay with the standard Python gRPC client (grpcio).

Stores a three-block prefix for one worker in DC "dc-a" through the producer's Ingest service,
waits until the indexer's Query service sees it, then prints the per-DC prefix depths and the
lane table. Stubs are generated on the fly from proto/ckf/v1/*.proto with grpcio-tools.

    pip install grpcio grpcio-tools
    python3 examples/grpc_client.py --producer 127.0.0.1:7500 --indexer 127.0.0.1:7400
"""
import argparse
import importlib
import pathlib
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_stubs():
    out = pathlib.Path(tempfile.mkdtemp(prefix="ckf-stubs-"))
    protos = [f"ckf/v1/{name}.proto" for name in ("common", "ingest", "relay", "query")]
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}",
            f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, str(out))
    return {name: importlib.import_module(f"ckf.v1.{name}_pb2") for name in ("ingest", "query")}, \
        {name: importlib.import_module(f"ckf.v1.{name}_pb2_grpc") for name in ("ingest", "query")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producer", default="127.0.0.1:7500", help="producer gRPC host:port")
    ap.add_argument("--indexer", default="127.0.0.1:7400", help="indexer gRPC host:port")
    opts = ap.parse_args()
    pb, rpc = load_stubs()

    ingest = rpc["ingest"].IngestStub(grpc.insecure_channel(opts.producer))
    query = rpc["query"].QueryStub(grpc.insecure_channel(opts.indexer))

    blocks = [0x1111, 0x2222, 0x3333]  # 64-bit sequence block hashes, in prefix order
    member = pb["ingest"].MemberId(worker_id=7, dp_rank=0)
    batch = pb["ingest"].KvEventBatch(
        source_id=f"example-{int(time.time())}", sequence=1,
        events=[pb["ingest"].KvEvent(member=member, stored=pb["ingest"].Stored(block_hashes=blocks))])
    result = ingest.PublishBatch(batch)
    print("ingest:", result.events[0].status and pb["ingest"].EventStatus.Name(result.events[0].status),
          "applied", result.events[0].applied_blocks)

    request = pb["query"].FindMatchesRequest(block_hashes=blocks + [0x4444])
    deadline = time.time() + 10
    while True:
        answer = query.FindMatches(request)
        if any(m.depth == len(blocks) for m in answer.matches) or time.time() > deadline:
            break
        time.sleep(0.05)
    for m in answer.matches:
        print(f"lane {m.lane} {m.pool.domain}/{m.pool.dc}: prefix depth {m.depth}")

    lanes = query.ListLanes(pb["query"].ListLanesRequest())
    for lane in lanes.lanes:
        print(f"lane {lane.lane} {lane.pool.dc}: {pb['query'].LaneState.Name(lane.state)} "
              f"epoch {lane.lease_epoch} seq {lane.installed_sequence}")

    # Clean up: the worker leaves (all its ranks are cleared).
    ingest.PublishBatch(pb["ingest"].KvEventBatch(
        source_id=batch.source_id, sequence=2,
        events=[pb["ingest"].KvEvent(member=member, worker_removed=pb["ingest"].WorkerRemoved())]))


if __name__ == "__main__":
    main()
