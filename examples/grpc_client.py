#!/usr/bin/env python3
"""Worked example: drive ckf-relay with the standard Python gRPC client (grpcio).

Stores a three-block prefix for one worker in DC "dc-a" through the producer's Ingest service and
pushes that worker's load (ReportLoad), waits until the indexer's Query service sees them, then
prints the per-DC prefix depths, the routing decision (Route) and the lane table. Stubs are generated on the fly from proto/ckf/v1/*.proto with grpcio-tools.

Before publishing, it asks the producer where its source stands (GetSourceSequence) and numbers
its batches from there: a new source id (the default, fresh per run) starts at 1; an id given
with --source-id that the producer already knows, restarted or not, resumes at the sequence the
producer expects next.

    pip install grpcio grpcio-tools
    python3 examples/grpc_client.py --producer 127.0.0.1:7500 --indexer 127.0.0.1:7400

Against TLS services (compose, Kubernetes: see the README's Security section), give the CA and,
where the server requires one, a client certificate; bearer tokens go in the authorization
metadata:

    python3 examples/grpc_client.py --producer localhost:7501 --indexer localhost:7400 \
        --ca deploy/compose/certs/ca.crt --cert deploy/compose/certs/query.crt \
        --key deploy/compose/certs/query.key --query-token-file deploy/compose/certs/query.token
"""
import argparse
import importlib
import pathlib
import secrets
import shutil
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_stubs():
    out = pathlib.Path(tempfile.mkdtemp(prefix="ckf-stubs-"))
    import atexit
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    protos = [f"ckf/v1/{name}.proto" for name in ("common", "ingest", "relay", "query")]
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT / 'proto'}", f"-I{include}",
            f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, str(out))
    return {name: importlib.import_module(f"ckf.v1.{name}_pb2") for name in ("ingest", "query")}, \
        {name: importlib.import_module(f"ckf.v1.{name}_pb2_grpc") for name in ("ingest", "query")}


def channel(target, opts):
    """A plaintext channel, or TLS when --ca is given (with a client certificate if --cert)."""
    if not opts.ca:
        return grpc.insecure_channel(target)
    read = lambda path: pathlib.Path(path).read_bytes() if path else None
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(opts.ca), private_key=read(opts.key),
        certificate_chain=read(opts.cert))
    options = [("grpc.ssl_target_name_override", opts.server_name)] if opts.server_name else []
    return grpc.secure_channel(target, creds, options=options)


def bearer(path):
    """gRPC call metadata carrying the token of `path` (one line), or none."""
    if not path:
        return None
    return (("authorization", "Bearer " + pathlib.Path(path).read_text().strip()),)


def main():
    try:
        run()
    except grpc.RpcError as e:
        hint = ""
        text = (e.details() or "").lower()
        if "wrong_version_number" in text or "handshake" in text:
            hint = ("\nhint: TLS mismatch: --ca makes both channels TLS; is each server serving "
                    "TLS (producer: --tls-cert/--tls-key)? Without --ca both are plaintext.")
        elif e.code() == grpc.StatusCode.NOT_FOUND and "domain" in text:
            hint = "\nhint: --domain names a model this indexer does not serve"
        elif e.code() == grpc.StatusCode.UNAUTHENTICATED:
            hint = "\nhint: pass --query-token-file / --ingest-token-file (see the README's Security)"
        sys.exit(f"error: {e.code().name}: {e.details()}{hint}")


def run():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producer", default="127.0.0.1:7500", help="producer gRPC host:port")
    ap.add_argument("--indexer", default="127.0.0.1:7400", help="indexer gRPC host:port")
    ap.add_argument("--ca", help="CA bundle (PEM): connect over TLS and verify the servers")
    ap.add_argument("--cert", help="client certificate (PEM) for servers requiring mutual TLS")
    ap.add_argument("--key", help="private key (PEM) of --cert")
    ap.add_argument("--server-name", help="name checked in the server certificates")
    ap.add_argument("--query-token-file", help="the indexer's auth.query_token_file")
    ap.add_argument("--domain", help="the indexer domain (model) the queries are for, sent as "
                    "ckf-domain metadata (default: none, the indexer's own)")
    ap.add_argument("--ingest-token-file", help="an [[ingest_auth.sources]] token_file")
    ap.add_argument("--source-id", help="publish as this source id, resuming where the producer "
                    "says it stands (default: a fresh id per run)")
    opts = ap.parse_args()
    if bool(opts.cert) != bool(opts.key):
        ap.error("--cert and --key go together")
    pb, rpc = load_stubs()

    ingest = rpc["ingest"].IngestStub(channel(opts.producer, opts))
    query = rpc["query"].QueryStub(channel(opts.indexer, opts))
    ingest_md, query_md = bearer(opts.ingest_token_file), bearer(opts.query_token_file)
    if opts.domain:
        query_md = (query_md or ()) + (("ckf-domain", opts.domain),)

    # A source's sequence only moves forward: a fresh id per run unless one is given, and ask
    # the producer which sequence it expects next (a known source resumes there).
    source_id = opts.source_id or f"example-{secrets.token_hex(8)}"
    position = ingest.GetSourceSequence(
        pb["ingest"].GetSourceSequenceRequest(source_id=source_id), metadata=ingest_md)
    if not position.known:
        sequence = 1  # any sequence is accepted as a source's first batch; 1 by convention
        print(f"source: new to the producer, starting at sequence {sequence}")
    elif position.HasField("next_sequence"):
        sequence = position.next_sequence
        print(f"source: resuming at sequence {sequence} (last applied {position.last_applied}, "
              f"producer incarnation {position.incarnation:#x})")
    else:
        sys.exit(f"error: source {source_id!r} has used its last sequence; give a new --source-id")

    blocks = [0x1111, 0x2222, 0x3333]  # 64-bit sequence block hashes, in prefix order
    member = pb["ingest"].MemberId(worker_id=7, dp_rank=0)
    batch = pb["ingest"].KvEventBatch(
        source_id=source_id, sequence=sequence,
        events=[pb["ingest"].KvEvent(member=member, stored=pb["ingest"].Stored(block_hashes=blocks))])
    result = ingest.PublishBatch(batch, metadata=ingest_md)
    if result.duplicate or not result.events:
        sys.exit(f"error: the batch was not applied: {result}")
    print("ingest:", result.events[0].status and pb["ingest"].EventStatus.Name(result.events[0].status),
          "applied", result.events[0].applied_blocks)

    # The worker's load, pushed (for workers whose load the producer does not scrape): it enters
    # the pool's load report to the indexer at the producer's next load interval.
    pushed = ingest.ReportLoad(pb["ingest"].ReportLoadRequest(
        source_id=source_id, worker_id=7, running=2, waiting=1, kv_usage=0.3,
        prefill_tokens_per_s=20000.0), metadata=ingest_md)
    print(f"load: pushed, counted at {pushed.prefill_tokens_per_s:.0f} tokens/s, "
          f"known for {pushed.expires_in_ms} ms unless pushed again")

    request = pb["query"].FindMatchesRequest(block_hashes=blocks + [0x4444])
    deadline = time.time() + 10
    while True:
        answer = query.FindMatches(request, metadata=query_md)
        if any(m.depth == len(blocks) for m in answer.matches) or time.time() > deadline:
            break
        time.sleep(0.05)
    for m in answer.matches:
        print(f"lane {m.lane} {m.pool.domain}/{m.pool.dc}: prefix depth {m.depth}")

    # Which DC should serve it: expected time to first token per DC (prefix, load, round trip),
    # with this router's own round trip to dc-a (others: the indexer's configured ones).
    route_request = pb["query"].RouteRequest(hashes=request, rtt_ms={"dc-a": 2.0})
    deadline = time.time() + 5
    while True:  # until dc-a's load report (with the pushed load) reached the indexer
        routed = query.Route(route_request, metadata=query_md)
        known = [d for d in routed.ranked if d.pool.dc == "dc-a"
                 and d.load_state == pb["query"].LoadState.Value("LOAD_STATE_KNOWN")]
        if known or time.time() > deadline:
            break
        time.sleep(0.1)
    for d in routed.ranked:
        print(f"route {d.pool.dc}: ttft {d.ttft_ms:.1f} ms = rtt {d.rtt_ms:.1f} + queue "
              f"{d.queue_ms:.1f} + prefill {d.prefill_ms:.1f} (cached {d.cached_tokens} tokens, "
              f"load {pb['query'].LoadState.Name(d.load_state)}: {d.running} running, "
          f"{d.waiting} waiting)")
    print(f"route: choose {routed.chosen.dc or '-'} "
          f"({pb['query'].RouteReason.Name(routed.reason)})")

    lanes = query.ListLanes(pb["query"].ListLanesRequest(), metadata=query_md)
    for lane in lanes.lanes:
        print(f"lane {lane.lane} {lane.pool.dc}: {pb['query'].LaneState.Name(lane.state)} "
              f"epoch {lane.lease_epoch} seq {lane.installed_sequence}")

    # Clean up: the worker leaves (all its ranks are cleared).
    ingest.PublishBatch(pb["ingest"].KvEventBatch(
        source_id=batch.source_id, sequence=sequence + 1,
        events=[pb["ingest"].KvEvent(member=member, worker_removed=pb["ingest"].WorkerRemoved())]),
        metadata=ingest_md)


if __name__ == "__main__":
    main()
