"""MoE routing in transformers models (`ascent.models.moe`) and the Qwen3-MoE family: the family reads the
expert facts, the tiny checkpoint is saved per expert, recording gives every token's experts, replaying a
forward's own experts changes nothing, replaying others changes the experts (and only where recorded), and
packing lays recorded experts out like the packed row."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import TrainSample
from ascent.models import load_model
from ascent.models.families import family_for
from ascent.models.moe import NOT_RECORDED, RoutingRecorder, RoutingReplay, is_moe, routers
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.trainer.packing import pack


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe"), num_experts=4)


def test_family_reads_the_expert_facts(moe_path):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    spec = family_for("qwen3_moe").spec(AutoConfig.from_pretrained(moe_path))
    assert (spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size) == (4, 2, 32)
    assert spec.moe_layers == (0, 1) and spec.norm_topk_prob and spec.is_moe
    names = load_file(str(moe_path / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names  # saved per expert, as released ones


def _forward(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def test_record_then_replay_own_experts_is_the_same_forward(moe_path):
    model = load_model(moe_path, dtype="fp32", device="cpu")
    assert is_moe(model) and len(routers(model)) == 2
    ids = torch.randint(4, 80, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), RoutingRecorder(model) as rec:
        want = _forward(model, ids)
        routes = rec.take()
    assert routes.shape == (12, 2, 2) and routes.dtype == torch.int16
    replay = RoutingReplay(model)
    with torch.no_grad(), replay.replaying(routes.long()):
        torch.testing.assert_close(_forward(model, ids), want, atol=0, rtol=0)
    other = (routes.long() + 1) % 4  # every token to other experts
    other[:3] = NOT_RECORDED  # the first three tokens route themselves
    with torch.no_grad(), replay.replaying(other), RoutingRecorder(model) as rec:
        changed = _forward(model, ids)
        used = rec.take().long()
    # the recorder hooks run after the replay's: they see the experts the forward used
    assert torch.equal(used[3:], other[3:]) and torch.equal(used[:3], routes[:3].long())
    # token 0 attends to itself only and keeps its own experts: the same output up to rounding (an
    # expert's matmul over another number of rows may round differently on some CPUs' BLAS kernels)
    torch.testing.assert_close(changed[0, :1], want[0, :1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(changed[0, 3:], want[0, 3:])
    with torch.no_grad():
        torch.testing.assert_close(_forward(model, ids), want, atol=0, rtol=0)  # hooks idle outside


def test_replay_refuses_experts_of_another_shape(moe_path):
    model = load_model(moe_path, dtype="fp32", device="cpu")
    replay = RoutingReplay(model)
    with (
        pytest.raises(ValueError, match="3 MoE layers"),
        replay.replaying(torch.zeros(5, 3, 2, dtype=torch.long)),
    ):
        pass
    ids = torch.randint(4, 80, (1, 6))
    wrong = torch.zeros(5, 2, 2, dtype=torch.long)  # 5 tokens' experts for a 6-token forward
    with (
        pytest.raises(ValueError, match="routed_experts do not match"),
        torch.no_grad(),
        replay.replaying(wrong),
    ):
        _forward(model, ids)


def test_pack_lays_experts_out_like_the_row():
    routed = torch.arange(4 * 2 * 2, dtype=torch.int16).view(4, 2, 2)  # 3 prompt + 1 of 2 response tokens
    a = TrainSample([5, 6, 7], [8, 9], [1, 1], [0.0, 0.0], routed_experts=routed)
    b = TrainSample([5], [8], [1], [0.0])  # no experts recorded: the trainer routes it itself
    packed = pack([b, a])
    assert packed.routed_experts is not None and packed.routed_experts.shape == (7, 2, 2)
    assert (packed.routed_experts[:2] == NOT_RECORDED).all() and (packed.routed_experts[6] == -1).all()
    assert torch.equal(packed.routed_experts[2:6], routed.long())
    assert pack([b]).routed_experts is None
    too_long = TrainSample([5], [8], [1], [0.0], routed_experts=routed)
    with pytest.raises(ValueError, match="sample 0: routed_experts"):
        pack([too_long])
