"""`ascent doctor` with rollout.quantization=fp8: FP8 matmuls need compute capability 8.9+."""

from __future__ import annotations

from ascent.doctor import system


def test_doctor_fails_fp8_on_a_gpu_without_it_and_passes_it_on_hopper():
    gib = 1 << 30
    v100 = system.GpuFacts("2.13.0", "12.1", "535.0", ["V100"], [32 * gib], [(7, 0)], "2.18.1")
    h100 = system.GpuFacts("2.13.0", "12.1", "535.0", ["H100"], [80 * gib], [(9, 0)], "2.18.1")
    assert system.check_fp8(v100, "none") == []
    (low,) = system.check_fp8(v100, "fp8")
    assert low.status == "fail" and "rollout.quantization=none" in str(low)
    assert [r.status for r in system.check_fp8(h100, "fp8")] == ["ok"]
