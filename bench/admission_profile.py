"""Where the fast engine's time goes when requests arrive while it decodes (host wall time per engine method).

    python bench/admission_profile.py --shape 0.5b --new-tokens 256 --repeats 2 --feed 256  # feeding on
    python bench/admission_profile.py --shape 0.5b --new-tokens 256 --repeats 2 --feed 0    # all prefill

Three phases per repeat, the same seeded chat prompts each time: one `generate` call with one request per
client; one call with all `--clients x --calls` requests (rows refill as sequences end); and "direct live":
`--clients` callers each sending `--calls` requests in a row into a `Batcher` (an agent's pattern, no HTTP).
Each prints tokens/s, the engine's counters (decode steps, prefill passes) and the host time spent in each
engine method. `--trace NAME` also writes a torch.profiler trace of the last live phase to $OUT (or /tmp).
"""

import argparse
import collections
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_overhead as so
import torch

from ascent.envs.chat import ChatTokens
from ascent.models.loading import load_tokenizer
from ascent.models.tiny import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine

p = argparse.ArgumentParser()
p.add_argument("--clients", type=int, default=64)
p.add_argument("--calls", type=int, default=4)
p.add_argument("--new-tokens", type=int, default=256)
p.add_argument("--shape", default="0.5b")
p.add_argument("--repeats", type=int, default=2)
p.add_argument("--trace", default="")
p.add_argument("--feed", type=int, default=256)
a = p.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
args = argparse.Namespace(clients=a.clients, new_tokens=a.new_tokens, calls_per_client=a.calls)
root = Path(tempfile.mkdtemp())
path = make_tiny_checkpoint(root / "model", max_position_embeddings=2048, seed=0, **so.SHAPES[a.shape])
tok = load_tokenizer(path)
chat = ChatTokens(tok)
eng = build_fast_engine(
    model_path=str(path),
    dtype="bf16" if dev == "cuda" else "fp32",
    device=dev,
    feed_prompt_tokens=a.feed,
    max_batch_size=a.clients,
    max_model_len=2048,
    gpu_memory_fraction=0.3,
)
T = collections.defaultdict(float)
N = collections.Counter()


def timed(obj, name, label=None):
    f = getattr(obj, name)
    label = label or name

    @functools.wraps(f)
    def w(*x, **k):
        t = time.perf_counter()
        try:
            return f(*x, **k)
        finally:
            T[label] += time.perf_counter() - t
            N[label] += 1

    setattr(obj, name, w)


for n in ["_admit", "_admit_fed", "_drain", "_maybe_compact", "_launch", "_process", "_feed", "_finished"]:
    timed(eng, n)
timed(eng.runner, "prefill", "runner.prefill")
timed(eng.runner, "sample_first", "runner.sample_first")
timed(eng.state, "admit", "state.admit")
timed(eng.state, "release", "state.release")
timed(eng.state, "set_pages", "state.set_pages")
timed(eng.sched, "admit", "sched.admit")
timed(eng.cache, "copy_pages", "cache.copy_pages")
timed(eng.state, "compact", "state.compact")
if eng.graphs is not None:
    timed(eng.graphs, "replay", "graphs.replay")


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def big():
    reqs = [so.request(chat, args, i % a.clients) for i in range(a.clients * a.calls)]
    t = time.perf_counter()
    g = eng.generate(reqs)
    sync()
    return time.perf_counter() - t, sum(len(x[0].token_ids) for x in g)


def report(label, s, tok, s0):
    d = {
        k: eng.stats[k] - s0[k] for k in ("steps", "prefills", "compactions", "prefill_tokens", "fed_tokens")
    }
    print(
        f"{label}: {tok} tokens {s:.3f}s {tok / s:,.0f}/s {d}  ms/step {1000 * s / max(d['steps'], 1):.2f}",
        flush=True,
    )
    print(
        "   " + ", ".join(f"{k} {1000 * T[k]:.0f}ms/{N[k]}" for k in sorted(T, key=lambda k: -T[k])),
        flush=True,
    )
    T.clear()
    N.clear()


so.direct(eng, chat, args)
so.direct_live(eng, chat, args)
big()  # warm-up
T.clear()
N.clear()
v = f"feed {a.feed}"
for r in range(a.repeats):
    s0 = dict(eng.stats)
    d_s, d_t = so.direct(eng, chat, args)
    report(f"[{v}] direct one batch of {a.clients}", d_s, d_t, s0)
    s0 = dict(eng.stats)
    b_s, b_t = big()
    report(f"[{v}] direct {a.clients * a.calls} in one call", b_s, b_t, s0)
    s0 = dict(eng.stats)
    prof = None
    if a.trace and r == a.repeats - 1:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    l_s, l_t = so.direct_live(eng, chat, args)
    if prof is not None:
        prof.__exit__(None, None, None)
        out = os.environ.get("OUT", "/tmp")
        prof.export_chrome_trace(f"{out}/{a.trace}")
        os.system(f"gzip -f {out}/{a.trace}")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
        print(
            prof.key_averages().table(
                sort_by="self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total", row_limit=25
            )
        )
    report(f"[{v}] direct live {a.clients}x{a.calls}", l_s, l_t, s0)
