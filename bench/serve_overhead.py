"""What the OpenAI endpoint costs: the same chat requests through `ascent serve`'s server and straight into
the engine, in one process, alternating.

    python bench/serve_overhead.py --device cuda --clients 256 --new-tokens 256 --repeats 3  # fast engine
    python bench/serve_overhead.py --device cuda --clients 256 --api-processes 8              # 8 front ends
    python bench/serve_overhead.py --device cpu --clients 16 --new-tokens 32 --shape tiny     # CPU smoke run
    python bench/serve_overhead.py --engine scripted --shape tiny --clients 64 --api-processes 2  # host path

A random-weight checkpoint is written to disk (`--shape 0.5b`: Qwen2.5-0.5B's layers with the character
vocabulary; `tiny`: the test model) and loaded the way `ascent serve` loads one. Direct: one
`engine.generate` call with every request (the prompts rendered by the same chat template, the same seeds).
Endpoint: `--clients` concurrent `AsyncOpenAI` chat calls against the server on a background thread, sent
from `--client-procs` processes (as agents in their own processes call it; 0: from the server's process,
whose client work then competes with the server for one interpreter). Both
report generated tokens per second (the endpoint's phase timed from its clients' first call to the last
reply, each client process warmed by one call first); the ratio is the endpoint's overhead (HTTP, JSON, the
batcher's request-granularity batching: requests that arrive during an engine call wait for the next one).
Direct live: the endpoint's arrival pattern (`--clients` callers, `--calls-per-client` calls each in a row)
submitted straight to a `Batcher` over the engine, without HTTP; endpoint/live is then the cost of the
HTTP path alone, and live/direct what the engine pays for requests that arrive while it decodes.
`--api-processes N` runs the server's HTTP work in N front-end processes (`ascent serve --api-processes`).

`--engine scripted` measures the host path alone: the engine answers every request at once with
`--new-tokens` fixed tokens, so the endpoint's requests per second are what parsing, templating,
tokenizing, detokenizing, JSON and the IPC to the engine's process cost (there is no direct run).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2),
}


class ScriptedEngine:
    """Answers at once: `new_tokens` printable ids per sample, finish "length" (the host path's bench)."""

    def __init__(self, tokenizer: Any, new_tokens: int) -> None:
        from ascent.messages import Generation

        ids = [i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip()][:64]
        reply = [ids[k % len(ids)] for k in range(new_tokens)]
        self.sample = Generation(reply, [-0.5] * new_tokens, "length")

    def generate(self, requests: list[Any]) -> list[list[Any]]:
        return [[self.sample] * r.params.n for r in requests]

    def update_weights(self, named_tensors: Any) -> None: ...

    def sleep(self, release_weights: bool = False) -> None: ...

    def wake(self) -> None: ...


def build(args: argparse.Namespace, root: Path):  # type: ignore[no-untyped-def]
    from ascent.envs.chat import ChatTokens
    from ascent.models.loading import load_tokenizer, resolve_device
    from ascent.models.tiny import make_tiny_checkpoint
    from ascent.rollout import build_engine
    from ascent.rollout.server import Limits, OpenAIServer, ServerOptions

    path = make_tiny_checkpoint(root / "model", max_position_embeddings=2048, seed=0, **SHAPES[args.shape])
    tok = load_tokenizer(path)
    limits = Limits(2048, len(tok), args.new_tokens)
    options = ServerOptions(
        "bench", limits, None, max_batch_requests=max(args.clients, 1), api_processes=args.api_processes
    )
    if args.engine == "scripted":
        engine: Any = ScriptedEngine(tok, args.new_tokens)
        return engine, OpenAIServer(engine, tok, options), ChatTokens(tok)
    dev = resolve_device(args.device)
    fast = dev.type == "cuda"
    kwargs = (
        {
            "max_batch_size": args.clients,
            "max_model_len": 2048,
            "gpu_memory_fraction": 0.3,
            "feed_prompt_tokens": args.feed_prompt_tokens,
        }
        if fast
        else {"generation_batch_size": args.clients}
    )
    engine = build_engine(
        "fast" if fast else "reference",
        model_path=str(path),
        dtype="bf16" if fast else "fp32",
        device=dev,
        **kwargs,
    )
    return engine, OpenAIServer(engine, tok, options), ChatTokens(tok)


def _passes(engine: Any) -> tuple[int, int, int, int]:
    """The fast engine's prefill passes, decode steps and prompt tokens fed through decode steps so far
    (zeros for engines without stats), and torch.compile's graphs."""
    stats = getattr(engine, "stats", {})
    return (
        int(stats.get("prefills", 0)),
        int(stats.get("steps", 0)),
        int(stats.get("fed_tokens", 0)),
        _compiles(),
    )


class GcTimer:
    """Time this process spends in the garbage collector's full (generation 2) passes (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds, self.count, self._t0 = 0.0, 0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds, self.count = self.seconds + time.perf_counter() - self._t0, self.count + 1


class Arrivals:
    """When requests reach the engine's batcher (wraps its `submit`): the spread of a burst's arrivals."""

    def __init__(self, batcher: Any) -> None:
        self.times: list[float] = []
        submit = batcher.submit

        def timed(*a: Any, **k: Any) -> Any:
            self.times.append(time.perf_counter())
            return submit(*a, **k)

        batcher.submit = timed

    def spread_ms(self, since: int) -> float:
        t = self.times[since:]
        return 1000 * (max(t) - min(t)) if t else 0.0


def _compiles() -> int:
    """Graphs torch.compile has made in this process so far (a recompile mid-phase costs seconds)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def _delta(before: tuple[int, ...], after: tuple[int, ...]) -> str:
    return "/".join(str(b - a) for a, b in zip(before, after, strict=True))


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {100 + 7 * i}*{10 + i % 90}?"}]


def request(chat, args: argparse.Namespace, i: int):  # type: ignore[no-untyped-def]
    """Client i's chat request as the engine gets it: the same prompt ids and seed as its endpoint call."""
    from ascent.messages import GenerationRequest, SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=i)
    return GenerationRequest(chat.prompt_ids(messages(i)), params, request_id=i)


def direct(engine, chat, args: argparse.Namespace) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    reqs = [request(chat, args, i) for i in range(args.clients)]
    t = time.perf_counter()
    gens = engine.generate(reqs)
    return time.perf_counter() - t, sum(len(g[0].token_ids) for g in gens)


def direct_live(engine, chat, args: argparse.Namespace) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """The endpoint's arrival pattern without HTTP: `--clients` coroutines, each submitting its requests
    one after another (`--calls-per-client`, the same prompts and seeds as its chat calls) to a `Batcher`
    over the engine, the server's own way into it (live calls join the running generate call)."""
    from ascent.rollout.server.batcher import Batcher

    batcher = Batcher(engine, max_batch_requests=max(args.clients, 1))
    batcher.start()

    async def client(i: int) -> int:
        total = 0
        for _ in range(args.calls_per_client):
            out = await asyncio.wrap_future(batcher.submit(request(chat, args, i)))
            total += len(out.generations[0].token_ids)
        return total

    async def everyone() -> int:
        return sum(await asyncio.gather(*(client(i) for i in range(args.clients))))

    t = time.perf_counter()
    try:
        tokens = asyncio.run(everyone())
    finally:
        batcher.close()
    return time.perf_counter() - t, tokens


async def ask_all(url: str, indices: list[int], new_tokens: int, calls: int = 1) -> tuple[int, float, float]:
    """Chat calls for `indices`, all at once, each client `calls` times in a row.

    Returns (completion tokens, wall-clock time of the first call's start, of the last reply): the
    client's import and construction are left out, as an agent pays them once, not per request."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    start = time.time()

    async def one(i: int) -> int:
        total = 0
        for _ in range(calls):
            out = await client.chat.completions.create(
                model="bench",
                messages=messages(i),  # type: ignore[arg-type]
                max_tokens=new_tokens,
                temperature=1.0,
                seed=i,
            )
            total += out.usage.completion_tokens if out.usage else 0
        return total

    tokens = await asyncio.gather(*(one(i) for i in indices))
    end = time.time()
    await client.close()
    return sum(tokens), start, end


def client_process(url: str, indices: list[int], new_tokens: int, calls: int) -> tuple[int, float, float]:
    return asyncio.run(ask_all(url, indices, new_tokens, calls))


def _warm_client(url: str) -> None:
    """Pool initializer: every client process makes one short call before any phase is timed, so its
    first request's one-off costs (imports, the HTTP stack's lazy set-up) do not land in a timed phase
    (seen on the GPU: a process's first request cost 1-3 s, the repeat it fell in ran at 0.09-0.22)."""
    from openai import OpenAI

    with OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600) as client:
        client.chat.completions.create(
            model="bench",
            messages=messages(0),  # type: ignore[arg-type]
            max_tokens=1,
        )


def endpoint(url: str, args: argparse.Namespace, pool: Any) -> tuple[float, int]:
    """All clients' calls: from `pool`'s processes (as separate agents would call), or from this one.

    Timed from the first client's first call to the last reply (wall clock, one host), so the pool's
    dispatch and the clients' construction are not counted against the server."""
    if pool is None:
        parts = [asyncio.run(ask_all(url, list(range(args.clients)), args.new_tokens, args.calls_per_client))]
    else:
        parts = pool.starmap(
            client_process,
            [
                (url, list(range(k, args.clients, args.client_procs)), args.new_tokens, args.calls_per_client)
                for k in range(args.client_procs)
            ],
        )
    return max(p[2] for p in parts) - min(p[1] for p in parts), sum(p[0] for p in parts)


def host_path(url: str, args: argparse.Namespace, pool: Any) -> None:
    """The scripted engine's runs: requests per second through the endpoint, nothing to compare with."""
    endpoint(url, args, pool)  # warm-up: connections, first-call imports
    rates, cpu_us = [], []
    requests = args.clients * args.calls_per_client
    for r in range(args.repeats):
        cpu = time.process_time()  # this process's CPU: the engine's (with --client-procs, no client work)
        seconds, tokens = endpoint(url, args, pool)
        rates.append(requests / seconds)
        cpu_us.append((time.process_time() - cpu) / requests * 1e6)
        print(
            f"repeat {r + 1}: {requests} requests ({tokens} tokens) in {seconds:.2f} s: {rates[-1]:,.0f} "
            f"requests/s; the engine's process spent {cpu_us[-1]:,.0f} us of CPU per request",
            flush=True,
        )
    print(
        f"host path, scripted engine: median {statistics.median(rates):,.0f} requests/s, "
        f"{statistics.median(cpu_us):,.0f} us of the engine process's CPU per request, over {len(rates)} "
        f"repeats ({args.api_processes} front-end processes, {args.clients} clients in "
        f"{args.client_procs or 1} processes, {args.new_tokens} tokens per reply)"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--client-procs", type=int, default=4, help="Client processes (0: the server's own).")
    p.add_argument("--calls-per-client", type=int, default=1, help="Chat calls each client makes in a row.")
    p.add_argument("--api-processes", type=int, default=1, help="HTTP front-end processes of the server.")
    p.add_argument(
        "--gather-ms",
        default=None,
        help="The server batcher's gather window (default: the Batcher's). A list (`2,0`) alternates "
        "its values over the repeats, as --switch-interval-ms does.",
    )
    p.add_argument(
        "--feed-prompt-tokens", type=int, default=256, help="The fast engine's feed_prompt_tokens (0: off)."
    )
    p.add_argument(
        "--switch-interval-ms",
        default=None,
        help="sys.setswitchinterval for this process (Python's default 5 ms): how long the engine's "
        "thread may wait for the interpreter while the server's event loop works. A list (`5,0.5`) "
        "alternates its values over the repeats (the first for the warm-up), so they compare in one run.",
    )
    p.add_argument(
        "--engine",
        choices=["real", "scripted"],
        default="real",
        help="real: the reference/fast engine; scripted: instant replies (the host path alone).",
    )
    args = p.parse_args(argv)
    intervals = [float(v) for v in (args.switch_interval_ms or "").split(",") if v]
    gathers = [float(v) for v in (args.gather_ms or "").split(",") if v]
    if intervals:
        sys.setswitchinterval(intervals[0] / 1000)
    pool = None
    with tempfile.TemporaryDirectory() as tmp:
        engine, server, chat = build(args, Path(tmp))
        url = server.start()
        try:
            if args.client_procs:
                pool = multiprocessing.get_context("spawn").Pool(args.client_procs, _warm_client, (url,))
            if args.engine == "scripted":
                host_path(url, args, pool)
                return
            with server.paused():
                direct(engine, chat, args)  # warm-up: compilation, CUDA graphs
            endpoint(url, args, pool)
            rows: dict[str, list[tuple[float, float, float]]] = {}
            gc_timer, arrivals = GcTimer(), Arrivals(server.batcher)
            for r in range(args.repeats):
                interval = intervals[r % len(intervals)] if intervals else None
                if interval is not None:
                    sys.setswitchinterval(interval / 1000)
                gather = gathers[r % len(gathers)] if gathers else None
                if gather is not None:
                    server.batcher.gather_s = gather / 1000
                setting = ", ".join(
                    ([f"switch interval {interval} ms"] if interval is not None else [])
                    + ([f"gather {gather} ms"] if gather is not None else [])
                )
                with server.paused():  # the engine is idle: direct calls from this thread are safe
                    s0 = _passes(engine)
                    d_s, d_tok = direct(engine, chat, args)
                    s1 = _passes(engine)
                    l_s, l_tok = direct_live(engine, chat, args)
                s2, gc0, seen = _passes(engine), (gc_timer.seconds, gc_timer.count), len(arrivals.times)
                e_s, e_tok = endpoint(url, args, pool)
                s3, gc1 = _passes(engine), (gc_timer.seconds, gc_timer.count)
                rows.setdefault(setting, []).append((d_tok / d_s, e_tok / e_s, l_tok / l_s))
                print(
                    f"repeat {r + 1}{f' ({setting})' if setting else ''}: direct {d_tok} tokens in {d_s:.2f} "
                    f"s ({d_tok / d_s:,.0f}/s); "
                    f"direct live {l_tok} tokens in {l_s:.2f} s ({l_tok / l_s:,.0f}/s); endpoint "
                    f"{e_tok} tokens in {e_s:.2f} s ({e_tok / e_s:,.0f}/s); endpoint/direct "
                    f"{(e_tok / e_s) / (d_tok / d_s):.3f}, endpoint/live "
                    f"{(e_tok / e_s) / (l_tok / l_s):.3f}; "
                    f"prefills/decode steps/fed prompt tokens/compiled graphs: direct {_delta(s0, s1)}, live "
                    f"{_delta(s1, s2)}, endpoint {_delta(s2, s3)}; full GC passes in the endpoint phase "
                    f"{gc1[1] - gc0[1]} ({1000 * (gc1[0] - gc0[0]):.0f} ms); the endpoint's requests reached "
                    f"the engine over {arrivals.spread_ms(seen):.0f} ms",
                    flush=True,
                )
        finally:
            server.stop()
            if pool is not None:
                pool.close()
    for setting, triples in rows.items():
        for name, ratios in (
            ("direct", [e / d for d, e, _ in triples]),
            ("live", [e / x for _, e, x in triples]),
        ):
            print(
                f"endpoint throughput / {name}: median {statistics.median(ratios):.3f}, range "
                f"{min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} repeats ({args.clients} clients x "
                f"{args.calls_per_client} "
                f"calls in {args.client_procs or 1} processes, {args.new_tokens} new tokens, "
                f"{args.api_processes} front-end processes{f', {setting}' if setting else ''})"
            )


if __name__ == "__main__":
    sys.exit(main())
