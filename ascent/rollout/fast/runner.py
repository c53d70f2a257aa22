"""Forward passes of the fast engine: batched prompt prefill and one decode step, over the paged cache.

`ModelRunner` strings the layer math (layers.py), the cache writes (kv_cache.py) and attention
(attention.py / triton_decode.py / triton_prefill.py) together. With `compile=True` the three per-token
pieces (attention input, attention output + MLP, head + sampling) go through `torch.compile`; the same
compiled code serves every layer, since weights are arguments. The decode step makes no host sync, so
graphs.py can capture it.

Batch-invariant mode (`batch_invariant=True`, rollout.batch_invariant): a row's tokens and logprobs must not
depend on the rows beside it. Matmul libraries pick kernels (tiling, split-K) by the number of rows and
padded prefills change shapes, so in this mode every prefill row, every decode row and every head matmul
runs alone (batch size 1, no padding), decode attention always reads max_model_len keys (masked past the
row's context), and the builder keeps to the torch attention and sampler, no CUDA graphs and no compile
(the sampler is row-wise already: counter-based noise per row, stages that are exact identities for rows
that do not use them). Cost: a decode step makes rows x layers small launches instead of layers big ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ascent.models.logits import logits_fp32
from ascent.models.moe import ROUTES_DTYPE
from ascent.rollout.fast.action import ActionStep
from ascent.rollout.fast.attention import decode_attention_torch, prefill_attention, slots_for
from ascent.rollout.fast.kv_cache import KVCache
from ascent.rollout.fast.moe import layer_math
from ascent.rollout.fast.spec import ModelSpec
from ascent.rollout.fast.state import DecodeState, Flags, allowed_mask, step_rows
from ascent.rollout.fast.vision import RowImages, assemble, mrope_cos_sin
from ascent.rollout.fast.weights import ModelWeights
from ascent.rollout.sampling import SamplingTensors, sample, token_presence

# the default of attn_options["fused_rope"]: the Triton decode kernel rotates q and k itself
# (triton_decode.py), saving each layer's RoPE kernel (0.5B decode step on an H200: 1.99 -> 1.95 ms). bf16
# weights only. The kernel and inductor's RoPE kernel may contract `x * cos + rot * sin` into FMAs
# differently, so on a GPU the two rotations can be an ulp of fp32 apart: with bf16 weights the rotation is
# rounded once to bf16, and a GPU run gave the unfused path's tokens and logprobs
# (tests/gpu/test_fast_fusions_gpu.py); with fp16 (3 more bits kept) and fp32 weights the same run gave other
# tokens after a near-tie, so those keep RoPE in attn_in. Either rounding is as close to the trainer's
# (eager, uncontracted) rotation. On CPU the interpreter's kernel is bit for bit either way.
FUSED_ROPE = True

# Shared-prefix decode attention by default (triton_cascade.py; Triton attention, not batch-invariant): the
# rows sharing a prompt's full KV pages read them once per group. H200, 256 rows of 512-token prompts: the
# 1.5B step 3.78 -> 3.44 ms, the 0.5B step 1.93 -> 1.86 ms (BENCHMARKS.md). It moves bf16 logprobs by an
# ulp of the attention sum; the GPU suite's exact comparisons (graphs against eager, prefix cache on and
# off) hold.
SHARED_PREFIX = True


# attn_options entries that tune only the shared-prefix kernel (triton_cascade.cascade_decode_attention)
CASCADE_KEYS = ("prefix_splits", "prefix_warps", "prefix_block_n", "prefix_stages")


def compile_step(fn: Callable) -> Callable:
    """`torch.compile` of a per-token piece (dynamic batch sizes; room for the recompiles of many layers and
    sampling flags)."""
    import torch._dynamo  # deferred: torch._dynamo, slow to import

    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
    torch._dynamo.config.accumulated_recompile_limit = max(
        1024, torch._dynamo.config.accumulated_recompile_limit
    )
    return torch.compile(fn, fullgraph=False)


def step_inputs(
    input_ids: Tensor,
    positions: Tensor,
    active: Tensor,
    rope_delta: Tensor | None,
    embed: Tensor,
    rope: tuple[Tensor, Tensor],
    max_len: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What a decode step's layers read, from its rows' state [B] -> (embeddings x [B, H], contexts [B]
    int32, 0 for idle rows; cos, sin [B, d] at each row's rotary position; `rope` the [max_len, d] tables).
    Compiled with the per-token pieces: its gathers and integer ops are then one or two kernels, not seven."""
    pos = positions.clamp(max=max_len - 1)
    ctx = ((pos + 1) * active).to(torch.int32)
    rot = pos if rope_delta is None else (positions + rope_delta).clamp(0, max_len - 1)
    return F.embedding(input_ids, embed), ctx, rope[0][rot], rope[1][rot]


class ModelRunner:
    """Weights + KV cache + RoPE tables -> prefill hidden states and sampled decode steps."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: ModelWeights,
        cache: KVCache,
        rope: tuple[Tensor, Tensor],
        max_model_len: int,
        attention: str = "torch",
        compile: bool = False,
        attn_options: dict | None = None,
        sampler: str = "torch",
        mrope_rows: Tensor | None = None,
        allowed: Tensor | None = None,
        batch_invariant: bool = False,
        moe_path: str = "dense",
    ):
        """`mrope_rows` [head_dim] (vision.py): a vision-language model's multimodal RoPE layout;
        `allowed` [V] bool: the tokens it may sample (its image pads never), None for a text model;
        `batch_invariant`: every row's forward runs alone (module doc), so its results do not depend on
        the other rows; `moe_path`: how an MoE layer computes its experts ("dense" or "routed", moe.py).
        `attn_options` tune the Triton decode kernel; its "prefill" entry the prefill kernel's, and its
        "fused_rope" (default `FUSED_ROPE`) whether that kernel rotates q and k (`rotates_in_kernel`); its
        "shared_prefix" (default `SHARED_PREFIX`) whether rows sharing prompt pages read them once per group
        (triton_cascade.py; `CASCADE_KEYS` tune that kernel)."""
        self.spec, self.w, self.cache = spec, weights, cache
        self.mrope_rows, self.allowed = mrope_rows, allowed
        self.cos, self.sin = rope
        self.ps, self.max_len = cache.page_size, max_model_len
        self.scale = spec.head_dim**-0.5
        self.attention, self.attn_options = attention, dict(attn_options or {})
        self.prefill_options = self.attn_options.pop("prefill", {})
        self.fused_rope = bool(self.attn_options.pop("fused_rope", FUSED_ROPE))
        # shared-prefix decode attention (triton_cascade.py): the Triton kernels only, and never in the
        # batch-invariant mode (a row's tokens would depend on which rows share its prompt)
        shared = bool(self.attn_options.pop("shared_prefix", SHARED_PREFIX))
        self.shared_prefix = shared and attention == "triton" and not batch_invariant
        tuning = {k: self.attn_options.pop(k) for k in CASCADE_KEYS if k in self.attn_options}
        self.cascade_options = self.attn_options | tuning  # the split kernel's options and the prefix's
        self.paged_prefill = attention == "triton"  # cached-prefix prefill through triton_prefill.py
        self.math, self.sampler = layer_math(spec, moe_path), sampler
        self.attn_in, self.attn_out, self.logits, self.sample = (
            self.math.attn_in,
            self.math.attn_out,
            self.math.logits,
            sample,
        )
        self.final_norm = self.math.final_norm
        self.step_inputs: Callable = step_inputs
        self.step_rows: Callable = step_rows  # (state.py) both compiled below with the rest
        self.batch_invariant = batch_invariant
        self.action: ActionStep | None = None  # a continuous action head (action.py): acts at prefill
        # routing replay (moe.py): (MoE layers, k) of the routes each forward records; None for dense models
        moe_layers = sum(lw.down_w.dim() == 3 for lw in weights.layers)
        self.route_shape = (moe_layers, spec.experts_per_token) if moe_layers else None
        self.attn_out_routed = getattr(self.math, "attn_out_routed", None)
        self.prefill_routes: Tensor | None = None  # the last prefill's routes [B, Lq, layers, k], host
        if compile:  # the fp32-output head matmul stays outside the compiled region
            self.attn_in, self.attn_out = compile_step(self.attn_in), compile_step(self.attn_out)
            if self.attn_out_routed is not None:
                self.attn_out_routed = compile_step(self.attn_out_routed)
            self.final_norm, self.sample = compile_step(self.final_norm), compile_step(sample)
            self.step_inputs, self.step_rows = compile_step(step_inputs), compile_step(step_rows)
            self.logits = lambda x, norm_w, lm_head: logits_fp32(
                self.final_norm(x, norm_w).to(lm_head.dtype), lm_head
            )

    def head_sample(
        self,
        x: Tensor,
        st: SamplingTensors,
        steps: Tensor,
        seen: Tensor | None,
        allowed: Tensor | None = None,
    ):
        """x [B, H], allowed [B, V] bool | None (rows' `allowed_token_ids`, state.py) -> (tokens [B],
        logprobs [B]) through the final norm, the LM head and the sampler. The model's own mask (a
        vision-language model's image pads) joins `allowed`; logprobs stay those of the unfiltered
        distribution.

        Plain temperature/greedy batches take the one-pass Triton sampler when `sampler="triton"`.
        """
        if self.batch_invariant:  # one row per head matmul (the sampler itself works row by row)
            logits = torch.cat(
                [self.logits(x[i : i + 1], self.w.norm, self.w.lm_head) for i in range(len(x))]
            )
        else:
            logits = self.logits(x, self.w.norm, self.w.lm_head)
        if self.allowed is not None:
            allowed = self.allowed if allowed is None else allowed & self.allowed
        plain = not (st.use_top_k_top_p or st.use_min_p or st.use_penalty or allowed is not None)
        if self.sampler == "triton" and plain:
            from ascent.rollout.fast.triton_sample import triton_sample  # deferred: triton, optional

            return triton_sample(logits, st.temperature, st.seeds, steps, st.all_greedy)
        if allowed is not None:
            return self.sample(logits, st, steps, seen, allowed)
        return self.sample(logits, st, steps, seen)

    def sample_first(
        self, hidden: Tensor, group: list[int], seqs: list, flags: Flags
    ) -> list[tuple[int, float]]:
        """hidden [G, H] (last prompt token of each group), group[i] the group of sample i (a Sequence:
        params, seed, prompt) -> [(token, logprob)] for every sample, at sampling step 0.

        A single sample is drawn twice (the same seed, the first kept): torch.compile builds new graphs
        for one row (it specializes size 1), which would stall a running batch for seconds."""
        if len(seqs) == 1:
            return self.sample_first(torch.cat([hidden, hidden]), [0, 1], seqs * 2, flags)[:1]
        dev = self.cache.device
        st = SamplingTensors.from_params([s.params for s in seqs], [s.seed for s in seqs], dev)
        st = dataclasses.replace(
            st,
            use_top_k_top_p=flags.top_k_top_p,
            use_min_p=flags.min_p,
            use_penalty=flags.penalty,
            all_greedy=flags.all_greedy,
        )
        seen = None
        if flags.penalty:
            width = max(len(s.prompt) for s in seqs)
            padded = [s.prompt + [-1] * (width - len(s.prompt)) for s in seqs]
            seen = token_presence(torch.tensor(padded, device=dev), self.spec.vocab_size)
        steps = torch.zeros(len(seqs), dtype=torch.long, device=dev)
        allowed = (
            allowed_mask([s.params for s in seqs], self.spec.vocab_size).to(dev) if flags.restricted else None
        )
        tokens, logprobs = self.head_sample(hidden[torch.tensor(group, device=dev)], st, steps, seen, allowed)
        return list(zip(tokens.tolist(), logprobs.tolist(), strict=True))

    def act_first(
        self, hidden: Tensor, group: list[int], seqs: list
    ) -> list[tuple[int, float, list[list[float]]]]:
        """hidden [G, H] (last prompt token of each group, before the final norm), group[i] the group of
        sample i -> (placeholder token, the chunk's log-probability, the chunk) per sample (action.py). The
        head reads the final norm's output in the model's dtype, as a Hugging Face model's last hidden state;
        a seeded request's first sample draws with its seed, as the reference engine's."""
        assert self.action is not None
        dev = self.cache.device
        normed = self.math.final_norm(hidden, self.w.norm).to(self.w.embed.dtype)  # eager: any batch size
        seeds = [s.params.seed if s.params.seed is not None and s.sample == 0 else s.seed for s in seqs]
        return self.action.act(normed[torch.tensor(group, device=dev)], seeds)

    def _layers(
        self,
        x: Tensor,
        cos: Tensor | None,
        sin: Tensor | None,
        slots: Tensor | None,
        attend: Callable,
        deepstack: tuple[Tensor, list[Tensor]] | None = None,
        routes: Tensor | None = None,
    ) -> Tensor:
        """x [T, H] through every layer; K/V of the T tokens are written to `slots` [T] first (None: the
        attention kernel writes them itself); cos/sin [T, d] rotate q and k (None: `attend` rotates them).
        The residual stream runs in fp32 (see layers.py).
        `deepstack` = (token indices [N], features [N, H] per layer): added to those tokens' hidden states
        after layer k (Qwen3-VL's visual features, vision.py). `routes` [T, MoE layers, k] (an MoE model):
        each MoE layer's chosen experts are written into it in place (a graph's persistent buffer).
        A layer's MLP output stays `pending` until the next layer's `attn_in` adds it to x (layers.py: no
        kernel of its own); the last layer's is added here, once."""
        x, pending = x.float(), None
        moe_layer = 0
        for i, lw in enumerate(self.w.layers):
            x, q, k, v = self.attn_in(x, pending, cos, sin, lw.ln1, lw.qkv_w, lw.qkv_b, lw.q_norm, lw.k_norm)
            if slots is not None:
                self.cache.write(i, slots, k, v)
            a = attend(i, q, k, v)
            if routes is not None and lw.down_w.dim() == 3:
                assert self.attn_out_routed is not None  # an MoE layer has MoeLayerMath
                x, ids = self.attn_out_routed(x, a, lw.o_w, lw.ln2, lw.gate_up_w, lw.down_w)
                pending = None  # the complete x (moe.py)
                routes[:, moe_layer].copy_(ids)
                moe_layer += 1
            else:
                x, pending = self.attn_out(x, a, lw.o_w, lw.ln2, lw.gate_up_w, lw.down_w)
            if deepstack is not None and i < len(deepstack[1]):  # the features join the complete residual
                x, pending = x if pending is None else x + pending, None
                x = x.index_put((deepstack[0],), x[deepstack[0]] + deepstack[1][i])
        return x if pending is None else x + pending

    @torch.no_grad()
    def prefill(
        self,
        suffixes: list[list[int]],
        starts: list[int],
        tables: list[list[int]],
        images: list[RowImages | None] | None = None,
    ) -> Tensor:
        """Prompt tokens after each row's cached prefix -> hidden state of each row's last token [B, H].

        suffixes[i] sit at positions starts[i].. of a sequence whose pages are tables[i] (covering the whole
        prompt). Rows are right-padded to the longest suffix; padding writes to the trash page. `images`
        (a vision-language model, vision.py): each row's multimodal RoPE positions and image embeddings.
        An MoE model's routes of the B x Lq tokens land in `self.prefill_routes` (host, [B, Lq, layers, k]).
        """
        if self.batch_invariant and len(suffixes) > 1:  # each row alone: no padding, no shared matmul
            rows = [
                self.prefill([x], [st], [t], None if images is None else [images[i]])
                for i, (x, st, t) in enumerate(zip(suffixes, starts, tables, strict=True))
            ]
            return torch.cat(rows)
        dev, ps = self.cache.device, self.ps
        b, lq = len(suffixes), max(len(s) for s in suffixes)
        if b * lq == 1:  # one token: pad to two, or torch.compile builds new graphs for size 1 (seconds,
            lq = 2  # mid-generation; the decode buckets start at 2)
        lens = torch.tensor([len(s) for s in suffixes])
        ids = torch.tensor([s + [0] * (lq - len(s)) for s in suffixes], device=dev)
        width = max(len(t) for t in tables)
        bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev)
        start_t = torch.tensor(starts, device=dev)
        pos = start_t[:, None] + torch.arange(lq, device=dev)[None, :]
        valid = torch.arange(lq)[None, :] < lens[:, None]
        pos_c = pos.clamp(max=min(width * ps, self.max_len) - 1)
        slots = torch.where(valid.to(dev), slots_for(bt, pos_c, ps), 0).reshape(-1)
        cos, sin = self.cos[pos_c].reshape(b * lq, -1), self.sin[pos_c].reshape(b * lq, -1)
        lk = max(s + len(x) for s, x in zip(starts, suffixes, strict=True))
        attend = self._prefill_attend(b, lq, start_t, max(starts) > 0, lens, bt, lk)
        x = F.embedding(ids.reshape(-1), self.w.embed)
        deepstack = None
        if images is not None and any(r is not None for r in images):
            assert self.mrope_rows is not None  # the engine takes images only with a vision tower
            pos3, index, embeds, deep = assemble(images, starts, lq, dev)
            pos3 = pos3.clamp(0, self.max_len - 1)
            cos, sin = mrope_cos_sin(self.cos, self.sin, pos3, self.mrope_rows)
            x = x.float().index_put((index,), embeds)
            deepstack = (index, deep) if deep else None
        shape = self.route_shape
        routes = torch.empty(b * lq, *shape, dtype=ROUTES_DTYPE, device=dev) if shape is not None else None
        x = self._layers(x, cos, sin, slots, attend, deepstack, routes)
        self.prefill_routes = routes.view(b, lq, *shape).cpu() if routes is not None and shape else None
        return x.view(b, lq, -1)[torch.arange(b, device=dev), (lens - 1).to(dev)]

    def _prefill_attend(
        self, b: int, lq: int, start_t: Tensor, cached_prefix: bool, lens: Tensor, bt: Tensor, lk: int
    ) -> Callable:
        """Attention of a prefill over b rows of lq query tokens (lens [B] real ones, host) whose sequences
        start at start_t [B] (after cached prefixes, if `cached_prefix`) on pages bt [B, P], lk the longest
        context: (layer, q, k, v) -> [b * lq, nh * d]."""
        dev = self.cache.device
        nh, kvh, d = self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim
        paged = self.paged_prefill and cached_prefix
        if paged:
            # deferred: triton, optional
            from ascent.rollout.fast.triton_prefill import paged_prefill_attention

            starts32, lens32 = start_t.to(torch.int32), lens.to(device=dev, dtype=torch.int32)

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            cached = None
            if cached_prefix:
                k_all, v_all = self.cache.tensors()
                cached = (k_all[i], v_all[i], bt, start_t, lk)
            if paged:  # continues cached prefixes: the paged kernel reads the history in place
                out = paged_prefill_attention(
                    q.view(b, lq, nh, d),
                    k_all[i],
                    v_all[i],
                    bt,
                    starts32,
                    lens32,
                    self.scale,
                    **self.prefill_options,
                )
            else:
                out = prefill_attention(
                    q.view(b, lq, nh, d), k.view(b, lq, kvh, d), v.view(b, lq, kvh, d), self.scale, cached
                )
            # a fresh tensor, not a view: a view's base has b rows, and b = 1 (one prompt) would make
            # torch.compile build new graphs mid-run (it specializes sizes 0 and 1)
            return out.reshape(b * lq, nh * d).clone()

        return attend

    def rotates_in_kernel(self) -> bool:
        """Whether decode steps leave RoPE to the Triton decode kernel (`fused_rope`): q and k reach it
        unrotated with each row's cos/sin. Not where Qwen3's q/k norms come first (the compiled norm and
        rotation share a kernel there, which the kernel's rotation might not match bit for bit), nor with
        fp16 or fp32 weights (`FUSED_ROPE`)."""
        bf16 = self.w.layers[0].qkv_w[0].dtype == torch.bfloat16
        return self.fused_rope and bf16 and self.attention == "triton" and self.w.layers[0].q_norm is None

    def _decode_attend(
        self,
        bt: Tensor,
        ctx: Tensor,
        max_len: int,
        rope: tuple[Tensor, Tensor] | None = None,
        groups: Tensor | None = None,
    ) -> Callable:
        """Attention of a decode step (one query token per row) -> (layer, q, k, v) -> [B, nh * d]; `rope`
        = (cos, sin) [B, d]: q and k are unrotated, the Triton kernel rotates them; `groups` [B, 2 +
        members] int32: the shared-prefix groups of the rows (state.py), read by triton_cascade.py."""

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k_all, v_all = self.cache.tensors()
            kc, vc = k_all[i], v_all[i]
            if groups is not None:
                # deferred: triton, optional
                from ascent.rollout.fast.triton_cascade import cascade_decode_attention

                return cascade_decode_attention(
                    q, kc, vc, bt, ctx, self.scale, groups, (k, v), rope=rope, **self.cascade_options
                )
            if self.attention == "triton":
                # deferred: triton, optional
                from ascent.rollout.fast.triton_decode import paged_decode_attention

                return paged_decode_attention(
                    q, kc, vc, bt, ctx, self.scale, (k, v), rope=rope, **self.attn_options
                )
            assert rope is None  # the torch path takes rotated q and k
            return decode_attention_torch(q, kc, vc, bt, ctx, max_len, self.scale)

        return attend

    @torch.no_grad()
    def decode_hidden(
        self,
        input_ids: Tensor,
        positions: Tensor,
        bt: Tensor,
        active: Tensor,
        max_len: int | None = None,
        rope_delta: Tensor | None = None,
        routes: Tensor | None = None,
        groups: Tensor | None = None,
    ) -> Tensor:
        """The layers of one decode step: input_ids, positions, active [B], block tables bt [B, P] -> the
        last hidden states [B, H] (K/V written to the cache). A tensor-parallel rank runs only this.
        `rope_delta` [B] (multimodal RoPE, vision.py): a text token rotates by its index plus its row's delta.
        `routes` [B, MoE layers, k]: where an MoE model's chosen experts are written (see `_layers`).
        `groups` [B, 2 + members] int32: shared-prefix groups (state.py; used with `shared_prefix` only).
        Batch-invariant: row by row, attention over the whole max_model_len (fixed, whatever the others')."""
        if self.batch_invariant:
            max_len = self.max_len
            if len(input_ids) > 1:
                return torch.cat(
                    [
                        self.decode_hidden(
                            input_ids[i : i + 1],
                            positions[i : i + 1],
                            bt[i : i + 1],
                            active[i : i + 1],
                            max_len,
                            None if rope_delta is None else rope_delta[i : i + 1],
                            None if routes is None else routes[i : i + 1],
                        )
                        for i in range(len(input_ids))
                    ]
                )
        slots = None
        if self.attention != "triton":
            slots = slots_for(bt, positions.clamp(max=self.max_len - 1)[:, None], self.ps)[:, 0]
        x, ctx, cos, sin = self.step_inputs(
            input_ids, positions, active, rope_delta, self.w.embed, (self.cos, self.sin), self.max_len
        )
        groups = groups if self.shared_prefix else None
        if self.rotates_in_kernel():
            attend = self._decode_attend(bt, ctx, max_len or self.max_len, (cos, sin), groups)
            return self._layers(x, None, None, slots, attend, routes=routes)
        attend = self._decode_attend(bt, ctx, max_len or self.max_len, None, groups)
        return self._layers(x, cos, sin, slots, attend, routes=routes)

    @torch.no_grad()
    def decode(self, st: DecodeState, b: int, flags: Flags, max_len: int | None = None) -> None:
        """One decode step over rows [0, b) of `st`: writes st.out_tokens/out_logprobs (and an MoE model's
        st.out_routes, the experts of each row's input token) and advances st.

        Idle rows (active 0) have context 0: the Triton kernel skips them; the torch path writes their K/V
        to the trash page through their all-zero block table. `max_len` bounds the context the torch
        attention reads (default max_model_len, as a graph needs).
        """
        rope_delta = st.rope_delta[:b] if self.mrope_rows is not None else None
        routes = st.out_routes[:b] if st.out_routes is not None else None
        x = self.decode_hidden(
            st.input_ids[:b],
            st.positions[:b],
            st.block_tables[:b],
            st.active[:b],
            max_len,
            rope_delta,
            routes,
            st.groups[:b] if st.groups is not None else None,
        )
        seen = None
        if flags.penalty:
            assert st.seen is not None  # generate() calls ensure_seen() for a penalty batch
            seen = st.seen[:b]
        allowed = None
        if flags.restricted:
            assert st.allowed is not None  # generate() calls ensure_allowed() for such a batch
            allowed = st.allowed[:b]
        tokens, logprobs = self.head_sample(x, st.sampling(b, flags), st.steps[:b], seen, allowed)
        st.advance(b, tokens, logprobs, flags, self.step_rows)
