"""The engine's Triton attention kernels compile for a Hopper GPU (sm_90) on a machine without one.

The interpreter tests (test_fast_triton_interpret.py, test_fast_cascade_interpret.py) check what the kernels
compute, but the interpreter runs Python, not Triton's compiler: a kernel it accepts may still fail to
compile (a non-constexpr range step, a shape the layouts refuse). Triton compiles down to PTX and runs the
ptxas of its own wheel without a GPU, so this test builds every variant the engine launches (the plain and
the shared-prefix split kernel with the new-token write and in-kernel RoPE, the prefix kernel, the split
merge, the paged prefill) for sm_90 and checks ptxas produced a cubin.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ascent.rollout.fast import triton_cascade, triton_decode, triton_prefill  # noqa: E402

FLOATS = {"qk_scale"}  # the kernels' one fp32 scalar; other lowercase arguments are int32


def _ptxas() -> bool:
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return bundled.exists() or shutil.which("ptxas") is not None


pytestmark = pytest.mark.skipif(not _ptxas(), reason="this triton install has no ptxas (no NVIDIA backend)")


def _compile(fn, consts: dict, dtypes: dict[str, str]) -> bytes:
    """Compile `fn` for sm_90: arguments in `consts` are constexprs, upper-case others pointers of
    dtypes[name] (default fp32), lower-case others scalars -> the cubin."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.isupper():
            sig[name] = f"*{dtypes.get(name, 'fp32')}"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    index = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    src = ASTSource(fn=fn, signature=sig, constexprs=index)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    return kernel.asm["cubin"]


def _io(dtype: str, names: tuple[str, ...]) -> dict[str, str]:
    return dict.fromkeys(names, dtype) | {
        "BT": "i32",
        "CTX": "i32",
        "GRP": "i32",
        "STARTS": "i32",
        "LENS": "i32",
    }


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("cascade", [False, True])
def test_the_decode_split_kernel_compiles(dtype, cascade):
    consts = dict(G=7, G_PAD=16, D=64, PAGE=64, BLOCK_N=64, SPLITS=1, WRITE=True, ROPE=True)
    consts |= dict(CASCADE=cascade, PRE_SPLITS=2, MEMBERS=8)
    assert _compile(triton_decode._split_kernel, consts, _io(dtype, ("Q", "K", "V", "KN", "VN", "OUT")))


@pytest.mark.parametrize("d,g,block_n", [(64, 7, 64), (128, 6, 128)])  # 128: blocks spanning two pages
def test_the_prefix_kernel_and_the_merge_compile(d, g, block_n):
    consts = dict(G=g, MEMBERS=8, R_PAD=64, D=d, PAGE=64, BLOCK_N=block_n, PRE_SPLITS=2, ROPE=True)
    assert _compile(triton_cascade._prefix_kernel, consts, _io("bf16", ("Q", "K", "V")))
    merge = dict(SPLITS=4, S_PAD=4, D=d)
    assert _compile(triton_decode._combine_kernel, merge, _io("bf16", ("OUT",)))


def test_the_paged_prefill_kernel_compiles():
    consts = dict(G=7, D=64, PAGE=64, BLOCK_M=64, BLOCK_N=64)
    assert _compile(triton_prefill._prefill_kernel, consts, _io("bf16", ("Q", "K", "V", "OUT")))
