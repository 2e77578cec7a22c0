"""`spiral-jax serve` once the weights are loaded: a ChatServer over them until SIGINT/SIGTERM, which
ends serving gracefully (running answers may finish for `settings.shutdown_s`; a second signal exits
at once). Takes plain values, so the command line's flags and config stay in cli.py."""
from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading

from spiral_jax.sampling import Sampler, bucket_length, cache_slots
from spiral_jax.serve.server import ChatServer, ServeSettings


def serve_settings(args, spec) -> ServeSettings:
    """ServeSettings from the serve command's flags (attributes of `args`) for the run `spec`, checked
    before any weights load: values ServeSettings refuses, answers that would run past the model's
    context, and a --host:--port that cannot be listened on (in use, or not an address here)."""
    mb = args.max_body_mb
    if not 0 < mb < math.inf:
        raise ValueError(f"--max_body_mb={mb:g}: give the largest request body in MB, a number above 0 (default 4)")
    s = ServeSettings(args.host, args.port, max_rows=spec.rollout.games_per_batch, max_tokens=args.max_tokens,
                      seed=spec.seed, api_key=args.api_key, allow_origin=tuple(args.allow_origin),
                      max_body_bytes=max(1, int(mb * 1e6)), timeout_s=args.timeout_s, shutdown_s=args.shutdown_s)
    prompt, context = spec.rollout.max_prompt_len, spec.model.max_position_embeddings
    if spec.model_path and prompt + s.max_tokens > context:
        raise ValueError(f"--max_tokens={s.max_tokens}: with prompts up to rollout.max_prompt_len={prompt} tokens, "
                         f"answers this long run past the model's context ({context} positions, {spec.model_source}); "
                         f"give --max_tokens={context - prompt} or less")
    try:  # the way http.server will bind it, let go at once
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((s.host, s.port))
    except OSError as err:
        raise ValueError(f"cannot listen on {s.host}:{s.port} ({err.strerror or err}); pick another --port or "
                         f"--host") from None
    return s


def serve(cfg, params, tokenizer, mesh, *, name: str, max_prompt_len: int, settings: ServeSettings) -> int:
    """Answer completions for `name` with prompts up to `max_prompt_len` tokens until a signal stops
    it; exit status 0. A host:port that cannot be listened on is a ValueError saying so."""
    s = settings
    sampler = Sampler(cfg, mesh, max_prompt_len=max_prompt_len,
                      max_cache_len=cache_slots(bucket_length(max_prompt_len), s.max_tokens))
    try:
        server = ChatServer(sampler, tokenizer, params, name, s)
    except OSError as err:
        raise ValueError(f"cannot listen on {s.host}:{s.port} ({err.strerror or err}); pick another "
                         f"--port or --host") from None
    stop = stop_on_signal(server, s.shutdown_s)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if s.api_key is None and not s.host.startswith("127.") and s.host not in ("localhost", "::1"):
        print(f"[serve] WARNING: listening on {s.host} without --api_key: anyone who can reach it can use it",
              file=sys.stderr, flush=True)
    print(f"[serve] {name} at {server.url} (prompts up to {max_prompt_len} tokens, answers up to {s.max_tokens}); "
          f"as an opponent: --config.eval.opponents='(\"openai:{name}@{server.url}\",)'", file=sys.stderr, flush=True)
    server.serve_forever()
    server.close()
    print("[serve] stopped", file=sys.stderr, flush=True)
    return 0


def stop_on_signal(server, shutdown_s: float):
    """A signal handler for `serve`: the first signal ends serve_forever (the caller then closes the
    server, which lets running answers finish for shutdown_s); a second one exits the process at
    once, without unwinding threads that are inside XLA."""
    stopping = threading.Event()

    def stop(signum, frame):
        if stopping.is_set():
            print("[serve] second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        stopping.set()
        print(f"[serve] stopping: no new connections, waiting requests refused, running answers get up to "
              f"{shutdown_s:g} s (a second signal exits at once)", file=sys.stderr, flush=True)
        threading.Thread(target=server.http.shutdown, daemon=True).start()  # serve_forever then returns

    return stop
