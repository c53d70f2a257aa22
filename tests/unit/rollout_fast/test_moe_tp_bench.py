"""bench/moe_tp.py's floor and bench/step_profile.py's kernel categories, without running an engine (the
bench itself runs on CPU as its docstring shows, in seconds too many for the suite): the floor counts the
experts a step's rows are expected to hit, and a routed MoE step's kernels land in the parts the profile
table names."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))
import moe_tp  # noqa: E402  (bench/moe_tp.py)
import step_profile  # noqa: E402  (bench/step_profile.py)


def _args(prompts: int, samples: int) -> SimpleNamespace:
    return SimpleNamespace(
        shape="30b-a3b", prompts=prompts, samples=samples, max_batch_size=128, prompt_len=256, new_tokens=128
    )


def test_floor_reads_every_expert_at_128_rows_and_fewer_at_a_few():
    spec = SimpleNamespace(kv_bytes_per_token=lambda dtype: 1000)
    engine = SimpleNamespace(runner=SimpleNamespace(spec=spec), bench_bytes=dict(experts=10**9, rest=10**8))
    full = moe_tp.floor(_args(16, 8), engine, bw=2e12)  # 128 rows, 8 of 128 experts a token
    assert full["experts_hit"] == pytest.approx(1 - (15 / 16) ** 128) and full["experts_hit"] > 0.999
    kv = 128 * (256 + 64) * 1000
    assert full["floor_gb"] == pytest.approx((full["experts_hit"] * 10**9 + 10**8 + kv) / 1e9)
    assert full["floor_ms"] == pytest.approx(1e3 * full["floor_gb"] * 1e9 / 2e12)
    few = moe_tp.floor(_args(1, 4), engine, bw=None)  # 4 rows: about a quarter of the experts
    assert 0.2 < few["experts_hit"] < 0.25 and "floor_ms" not in few


@pytest.mark.parametrize(
    ("kernel", "category"),
    [
        ("void cutlass::device_kernel<GemmUniversal<cutlass::gemm::GroupProblemShape<...>>>", "grouped_mm"),
        ("void at::cuda::detail::prepare_grouped_gemm_data<...>", "grouped_mm"),
        ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", "router (topk/softmax)"),
        ("triton_per_fused__softmax__to_copy_div_sum_1", "router (topk/softmax)"),
        ("void at::native::bitonicSortKVInPlace<...>", "sort/searchsorted/index copies"),
        ("triton_poi_fused_index_mul_sum_3", "sort/searchsorted/index copies"),
        ("triton_per_fused__to_copy_cumsum_eq_sum_0", "sort/searchsorted/index copies"),  # counting sort
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("_split_kernel", "attention"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norms"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "matmul (dense)"),
        ("triton_poi_fused_mul_silu_2", "elementwise (silu, adds, casts)"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "elementwise (silu, adds, casts)"),
        ("Memset (Device)", "other"),
    ],
)
def test_a_routed_steps_kernels_land_in_their_parts(kernel, category):
    assert step_profile.moe_category(kernel) == category


def test_categorize_sums_each_part_and_the_table_ranks_them():
    per = {"nvjet_a": (1.0, 2.0), "nvjet_b": (0.5, 1.0), "ncclDevKernel_AllReduce": (2.0, 96.0)}
    prof = step_profile.categorize(per, step_profile.moe_category, top=2)
    assert prof["categories"] == {"matmul (dense)": 1.5, "nccl": 2.0}
    assert prof["launches"] == {"matmul (dense)": 3.0, "nccl": 96.0}
    assert [name for name, _, _ in prof["top"]] == ["ncclDevKernel_AllReduce", "nvjet_a"]
    lines = step_profile.table(prof)
    assert lines[0].split()[0] == "nccl" and "3.500 ms/step" in lines[-1]
