import torch, time, sys
from ascent.models.tiny import make_tiny_moe_checkpoint, make_tiny_checkpoint
from ascent.messages import GenerationRequest, SamplingParams, TrainSample
from ascent.rollout import build_engine
from ascent.trainer import PolicyWorker
from ascent.models.moe import RoutingRecorder
torch.set_num_threads(1)
rs, es = float(sys.argv[1]), float(sys.argv[2])
t=time.time()
def gaps(p, dtype):
    ref = build_engine("reference", model_path=p, device="cpu", dtype=dtype)
    g = torch.Generator().manual_seed(0)
    reqs=[GenerationRequest(torch.randint(4, 80, (n,), generator=g).tolist(), SamplingParams(max_new_tokens=16, n=4, seed=3+n)) for n in (5, 12, 20, 30)]
    a=ref.generate(reqs)
    w = PolicyWorker(p, device="cpu")
    gens=[x for gs in a for x in gs]
    samples=[TrainSample(r.prompt_ids, x.token_ids, [1]*len(x.token_ids), [0.0]*len(x.token_ids), routed_experts=x.routed_experts) for r,gs in zip(reqs,a) for x in gs]
    out=[]
    for replay in (True, False):
        ss = samples if replay else [TrainSample(s.prompt_ids, s.response_ids, s.loss_mask, s.advantages) for s in samples]
        lp = w.compute_logprobs(ss)
        d=[abs(u-v) for l,x in zip(lp,gens) for u,v in zip(l,x.logprobs)]
        out.append((max(d), sum(d)/len(d)))
    return out
pm = make_tiny_moe_checkpoint('/tmp/moe_g', router_scale=rs, expert_scale=es)
pd = make_tiny_checkpoint('/tmp/dense_g')
for dt in ("fp32","bf16"):
    print(dt, "moe replay/free", gaps(pm, dt))
    print(dt, "dense", gaps(pd, dt)[0])
print(time.time()-t)
