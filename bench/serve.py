"""`spiral-jax serve` under concurrent clients: the engine server against the batch-per-call one.

64 clients send one chat request each at the same moment, with mixed answer lengths (a third each of
16, 64 and 256 new tokens; the stop ids are switched off so every answer runs to its length). Both
servers run the same random model (the tiny Qwen3's 4 x 256 layers) and the project's embedded
tokenizer on this machine:

- "batch": the batch-per-call server (its module is read from git, commit BATCH_SERVER): one
  `Sampler.generate` call per group of waiting requests with equal settings, each call running until
  its longest answer ends;
- "engine": `spiral_jax.serve`, every answer in its own slot of one `DecodeEngine` (continuous batching).

It prints per server the p50/p99 latency of the short, medium and long requests (of those answered),
the wall time, the generated tokens/s and the requests that failed (e.g. a connection reset), then
the ratios, from each server's round of the shortest wall time: after both are warmed up by the same
load three times (their programs compiled), --repeats measured rounds take turns between them.

    python bench/serve.py
    python bench/serve.py --clients 128 --slots 64
"""
import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

from spiral_jax.config import base_config
from spiral_jax.run.build import build_model, build_tokenizer
from spiral_jax.run.setup import run_spec
from spiral_jax.sampling import Sampler, bucket_length, cache_slots
from spiral_jax.serve import ChatServer
from spiral_jax.tokenizer import Tokenizer

BATCH_SERVER = "a249183"  # a commit whose spiral_jax/serve.py is the batch-per-call server
LENGTHS = (16, 64, 256)


def batch_server_class():
    """The batch-per-call ChatServer, loaded from the repository's history."""
    repo = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{BATCH_SERVER}:spiral_jax/serve.py"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout
    module = sys.modules["batch_serve"] = types.ModuleType("batch_serve")  # dataclasses look their module up
    exec(compile(source, f"{BATCH_SERVER}:spiral_jax/serve.py", "exec"), module.__dict__)  # noqa: S102
    return module.ChatServer


def post(port: int, body: dict) -> tuple[float, int]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    conn.close()
    return time.perf_counter() - start, reply["usage"]["completion_tokens"]


def load(port: int, clients: int) -> dict:
    """All clients at once; latencies by answer length, wall time, tokens, failed requests."""
    results: dict[int, list] = {n: [] for n in LENGTHS}
    tokens, failed = [], []

    def client(i):
        n = LENGTHS[i % len(LENGTHS)]
        try:
            seconds, used = post(port, {"messages": [{"role": "user", "content": f"Game {i}: your move."}],
                                        "max_tokens": n, "temperature": 1.0})
        except (OSError, http.client.HTTPException) as err:  # e.g. a reset connection: a failed request
            failed.append(type(err).__name__)
            return
        results[n].append(seconds)
        tokens.append(used)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latency": results, "wall": time.perf_counter() - start, "tokens": sum(tokens), "failed": len(failed)}


def best_load(loads: list[dict]) -> dict:
    """The load of the shortest wall time among a server's rounds."""
    return min(loads, key=lambda r: r["wall"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--slots", type=int, default=64, help="rows decoded together (both servers)")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per server, taking turns")
    args = parser.parse_args()

    c = base_config()
    c.model.random.update(vocab_size=2048, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                          num_kv_heads=2, head_dim=32, max_position_embeddings=4096)
    c.tokenizer.path = "embedded"
    c.lock()
    spec = run_spec(c)
    cfg, params = build_model(spec)
    tok = build_tokenizer(spec, cfg)
    endless = Tokenizer(tok.hf, tok.template, frozenset())  # no stop ids: every answer runs to max_tokens
    sampler = Sampler(cfg, max_prompt_len=256, max_cache_len=cache_slots(bucket_length(256), max(LENGTHS)))

    servers = {"batch": batch_server_class()(sampler, endless, params, "bench", port=0, max_rows=args.slots,
                                             max_tokens=max(LENGTHS)),
               "engine": ChatServer(sampler, endless, params, "bench", port=0, max_rows=args.slots,
                                    max_tokens=max(LENGTHS))}
    ports = {}
    for name, server in servers.items():
        server.start()
        ports[name] = server.http.server_address[1]
        for _ in range(3):  # compile the programs of every shape the measured run meets
            load(ports[name], args.clients)
    runs = {name: [] for name in servers}
    for _ in range(args.repeats):  # rounds that take turns, so a slow spell hits both servers alike
        for name, port in ports.items():
            runs[name].append(load(port, args.clients))
    for server in servers.values():
        server.close()
    rows = {name: best_load(r) for name, r in runs.items()}

    print(f"{args.clients} concurrent chat requests, answers of {'/'.join(map(str, LENGTHS))} tokens, "
          f"{args.slots} rows decoded together; the tiny Qwen3 (4 x 256) on this machine's CPU\n")
    print(f"{'server':8s} " + " ".join(f"{f'p50/p99 {n} tok':>18s}" for n in LENGTHS) + f" {'wall':>8s} {'tokens/s':>9s} {'failed':>7s}")
    for name, r in rows.items():
        cells = [f"{np.percentile(r['latency'][n], 50):7.2f}/{np.percentile(r['latency'][n], 99):6.2f} s"
                 for n in LENGTHS]
        print(f"{name:8s} " + " ".join(f"{cell:>18s}" for cell in cells)
              + f" {r['wall']:7.2f}s {r['tokens'] / r['wall']:9.0f} {r['failed']:7d}")
    b, e = rows["batch"], rows["engine"]
    ratios = [np.percentile(b["latency"][n], 50) / np.percentile(e["latency"][n], 50) for n in LENGTHS]
    print(f"\nengine over batch: p50 latency {' / '.join(f'{x:.2f}x' for x in ratios)} faster "
          f"({'/'.join(map(str, LENGTHS))} tokens), tokens/s {(e['tokens'] / e['wall']) / (b['tokens'] / b['wall']):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
