#!/usr/bin/python3
"""Example client of the Mneme engram store (mneme.engram.v1.EngramStore).

Fetches Engram rows from a running mneme_engram_store by row ids or by token
ids and writes them, row-major and little-endian, to a file; prints the row
ids served and the row shape as one JSON line on stdout.

Stubs are generated from proto/engram/v1/engram_store.proto with grpcio-tools
(Debian: python3-grpcio, python3-grpc-tools):

  python3 -m grpc_tools.protoc -I. --python_out=STUBS --grpc_python_out=STUBS \\
      proto/engram/v1/engram_store.proto

or let this script do it with --proto_root=REPO --stubs_dir=STUBS.

Examples:
  engram_client.py --server 127.0.0.1:50151 --layer 1 --ids 5,17,42 \\
      --encoding bf16 --out rows.bin
  engram_client.py --server 127.0.0.1:50151 --layer 1 \\
      --tokens 100,200,300,400,500 --context 3 --out rows.bin
  engram_client.py --server 127.0.0.1:50151 --describe
"""

import argparse
import json
import os
import subprocess
import sys

PROTO = "proto/engram/v1/engram_store.proto"


def load_stubs(stubs_dir, proto_root):
    """Imports the generated modules, generating them first if asked to."""
    if proto_root and not os.path.exists(
            os.path.join(stubs_dir, "proto/engram/v1/engram_store_pb2.py")):
        os.makedirs(stubs_dir, exist_ok=True)
        subprocess.run([
            sys.executable, "-m", "grpc_tools.protoc", "-I" + proto_root,
            "--python_out=" + stubs_dir, "--grpc_python_out=" + stubs_dir,
            os.path.join(proto_root, PROTO)
        ], check=True)
    sys.path.insert(0, stubs_dir)
    from proto.engram.v1 import engram_store_pb2  # pylint: disable=import-outside-toplevel
    from proto.engram.v1 import engram_store_pb2_grpc  # pylint: disable=import-outside-toplevel
    return engram_store_pb2, engram_store_pb2_grpc


def parse_ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="HOST:PORT")
    parser.add_argument("--layer", type=int, help="Engram layer id")
    parser.add_argument("--ids", help="row ids, comma-separated")
    parser.add_argument("--tokens", help="token ids, comma-separated")
    parser.add_argument("--context", type=int, default=0,
                        help="how many leading --tokens are context only")
    parser.add_argument("--columns", default="",
                        help="hash columns (default: all served)")
    parser.add_argument("--encoding", default="bf16",
                        choices=["bf16", "fp32", "raw"])
    parser.add_argument("--stream", action="store_true",
                        help="use LookupStream (large batches)")
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--out", help="file for the rows")
    parser.add_argument("--timeout_s", type=float, default=10.0,
                        help="deadline of the call")
    parser.add_argument("--stubs_dir", default=".")
    parser.add_argument("--proto_root", default="",
                        help="repository root to generate stubs from")
    args = parser.parse_args()

    import grpc  # pylint: disable=import-outside-toplevel
    pb2, pb2_grpc = load_stubs(args.stubs_dir, args.proto_root)
    service = pb2_grpc.EngramStoreStub(grpc.insecure_channel(args.server))

    try:
        if args.describe:
            from google.protobuf import json_format  # pylint: disable=import-outside-toplevel
            reply = service.Describe(pb2.DescribeRequest(), timeout=args.timeout_s)
            print(json_format.MessageToJson(reply, indent=None))
            return 0
        request = pb2.LookupRequest(
            layer_id=args.layer,
            encoding={
                "bf16": pb2.ROW_ENCODING_BF16,
                "fp32": pb2.ROW_ENCODING_FP32,
                "raw": pb2.ROW_ENCODING_RAW,
            }[args.encoding])
        if args.ids:
            request.row_ids.extend(parse_ints(args.ids))
        if args.tokens:
            request.token_ids.extend(parse_ints(args.tokens))
            request.context_token_count = args.context
            request.columns.extend(parse_ints(args.columns))
        if args.stream:
            replies = list(service.LookupStream(request, timeout=args.timeout_s))
        else:
            replies = [service.Lookup(request, timeout=args.timeout_s)]
    except grpc.RpcError as error:
        print(json.dumps({"code": error.code().name,
                          "message": error.details()}))
        return 2

    rows = b"".join(r.rows for r in replies)
    row_ids = [i for r in replies for i in r.row_ids]
    if args.out:
        with open(args.out, "wb") as f:
            f.write(rows)
    first = replies[0] if replies else pb2.LookupResponse()
    print(json.dumps({
        "row_ids": row_ids,
        "row_dim": first.row_dim,
        "row_bytes": first.row_bytes,
        "encoding": pb2.RowEncoding.Name(first.encoding),
        "messages": len(replies),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
