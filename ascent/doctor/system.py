"""Doctor checks of the machine: Python, torch, CUDA and driver, GPU capability, NCCL, host memory, disk,
ports, rendering.

`gpu_facts()` queries the GPUs once (tests replace it); each `check_*` returns a `CheckResult` naming the fix.
"""

from __future__ import annotations

import ctypes.util
import errno
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.envs.sim.frames import probe_renderer

MIN_PYTHON = (3, 11)
RENDER_LIBRARIES = ("EGL", "OSMesa")


@dataclass(frozen=True)
class GpuFacts:
    """The CUDA devices torch sees: names, memory, compute capability; CUDA runtime and driver versions."""

    torch_version: str
    cuda_runtime: str | None = None
    driver: str | None = None
    names: list[str] = field(default_factory=list)
    total_bytes: list[int] = field(default_factory=list)
    capability: list[tuple[int, int]] = field(default_factory=list)
    nccl: str | None = None

    @property
    def count(self) -> int:
        return len(self.names)


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def gpu_facts() -> GpuFacts:
    import torch  # deferred: torch; this module imports without it

    if not torch.cuda.is_available():
        return GpuFacts(torch.__version__, torch.version.cuda, _driver_version())
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    nccl = None
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return GpuFacts(
        torch.__version__,
        torch.version.cuda,
        _driver_version(),
        [p.name for p in props],
        [p.total_memory for p in props],
        [(p.major, p.minor) for p in props],
        nccl,
    )


# ------------------------------------------------------------------------------------------ versions
def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> CheckResult:
    text = ".".join(str(v) for v in version)
    if tuple(version[:2]) < MIN_PYTHON:
        return fail(
            "python", f"Python {text}", f"use Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (pyproject.toml)."
        )
    return ok("python", f"Python {text}", version=text)


def torch_requirement() -> str | None:
    """The torch specifier ascent was installed with (its package metadata), e.g. '<2.14,>=2.11'."""

    try:
        reqs = requires("ascent") or []
    except PackageNotFoundError:
        return None

    for line in reqs:
        req = Requirement(line)
        if req.name == "torch" and req.marker is None:
            return str(req.specifier)
    return None


def check_torch(facts: GpuFacts, spec: str | None) -> CheckResult:
    version = facts.torch_version
    if spec and Version(version.split("+")[0]) not in SpecifierSet(spec):
        return fail("torch", f"torch {version}", f"install a torch within {spec} (ascent's requirement).")
    return ok("torch", f"torch {version}" + (f" (required {spec})" if spec else ""), version=version)


def check_cuda(facts: GpuFacts, needs_gpu: bool) -> CheckResult:
    if facts.count == 0:
        built = (
            f"torch built for CUDA {facts.cuda_runtime}" if facts.cuda_runtime else "a CPU-only torch build"
        )
        if needs_gpu:
            return fail(
                "CUDA",
                f"no CUDA device visible ({built}; driver {facts.driver or 'not found'})",
                "run on a GPU machine with a CUDA build of torch, or set cluster.device=cpu "
                "(and rollout.engine=reference).",
            )
        return skipped("CUDA", f"no CUDA device ({built}); this config runs on the CPU")
    gpus = ", ".join(
        f"{n} ({t / 2**30:.0f} GiB)" for n, t in zip(facts.names, facts.total_bytes, strict=True)
    )
    return ok(
        "CUDA",
        f"CUDA {facts.cuda_runtime}, driver {facts.driver or '?'}: {gpus}",
        runtime=facts.cuda_runtime,
        driver=facts.driver,
        gpus=facts.names,
    )


def check_capability(facts: GpuFacts, dtype: str, fast_engine: bool, attention: str) -> list[CheckResult]:
    """bf16 (and varlen attention, and the engine's Triton kernels at full speed) need compute capability >=
    8.0."""
    name = "GPU capability"
    if facts.count == 0:
        return [skipped(name, "no CUDA device")]
    low = min(facts.capability)
    cap = f"{low[0]}.{low[1]}"
    out: list[CheckResult] = []
    if dtype == "bf16" and low < (8, 0):
        out.append(
            fail(
                name,
                f"model.dtype=bf16 needs compute capability >= 8.0; this GPU has {cap}",
                "set model.dtype=fp16 (or fp32) on this GPU, or use an Ampere-or-newer GPU.",
            )
        )
    if attention == "varlen" and low < (8, 0):
        out.append(
            fail(
                name,
                f"train.attention=varlen (flash varlen kernels) needs capability >= 8.0; {cap} here",
                "set train.attention=sdpa (or auto).",
            )
        )
    if fast_engine:
        out.append(check_triton(low))
    return out or [ok(name, f"compute capability {cap} runs model.dtype={dtype}", capability=cap)]


def check_fp8(facts: GpuFacts, quantization: str) -> list[CheckResult]:
    """rollout.quantization=fp8: FP8 matmuls need compute capability >= 8.9 (the engine refuses older GPUs;
    on CPU it runs an emulation)."""
    if quantization != "fp8":
        return []
    name = "FP8 rollout"
    if facts.count == 0:
        return [skipped(name, "no CUDA device (the engine emulates FP8 on CPU)")]
    low = min(facts.capability)
    if low < (8, 9):
        return [
            fail(
                name,
                f"rollout.quantization=fp8 needs FP8 matmuls (compute capability >= 8.9); this GPU has "
                f"{low[0]}.{low[1]}",
                "set rollout.quantization=none on this GPU.",
            )
        ]
    return [ok(name, f"compute capability {low[0]}.{low[1]} has FP8 matmuls")]


def check_triton(capability: tuple[int, int]) -> CheckResult:
    """The fast engine's decode attention and sampler are Triton kernels; without Triton it runs torch
    ones."""

    if importlib.util.find_spec("triton") is None:
        return warn(
            "fast engine kernels",
            "triton is not installed: the fast engine falls back to its slower torch attention and sampler",
            "install triton (it comes with CUDA builds of torch).",
        )
    if capability < (8, 0):
        return warn(
            "fast engine kernels",
            f"Triton kernels are tuned for capability >= 8.0 (this GPU: {capability[0]}.{capability[1]})",
            "use rollout.engine=reference if the fast engine fails.",
        )
    return ok("fast engine kernels", "triton installed, capability >= 8.0")


def check_nccl(facts: GpuFacts, gpus_needed: int, node_gpus_needed: int) -> CheckResult:
    """NCCL (and enough GPUs on this node) when the config spans more than one GPU."""
    if gpus_needed <= 1:
        return skipped("NCCL", "the config uses at most one GPU")
    if facts.count and not facts.nccl:
        return fail(
            "NCCL", "torch has no NCCL backend", "install a CUDA build of torch with NCCL (the Linux wheels)."
        )
    if node_gpus_needed > facts.count:
        return fail(
            "NCCL",
            f"the config needs {node_gpus_needed} GPUs on this node, {facts.count} are visible",
            "lower cluster.num_trainer_workers / num_rollout_workers, or join a Ray cluster "
            "(cluster.backend=ray, cluster.address).",
        )
    return ok("NCCL", f"NCCL {facts.nccl}, {facts.count} GPUs for {gpus_needed}", version=facts.nccl)


def host_memory(meminfo: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, available) bytes of this machine's RAM; (0, 0) where neither /proc/meminfo nor sysconf says."""
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        total, available = (int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
        return total, available
    except (OSError, KeyError, ValueError):
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total
    except (OSError, ValueError, AttributeError):
        return 0, 0


# ------------------------------------------------------------------------------------------- disk, ports
def existing_parent(path: str | Path) -> Path:
    """`path`, or the nearest of its parents that exists (where a new directory would be created)."""
    p = Path(path).expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_disk(name: str, path: str, needed: int, what: str, field_name: str) -> CheckResult:
    """Free space under `path` against `needed` bytes: fail below it, warn below twice it."""
    where = existing_parent(path)
    free = shutil.disk_usage(where).free
    text = f"{free / 2**30:.1f} GiB free at {where}; the run writes about {needed / 2**30:.1f} GiB ({what})"
    fix = f"free space there or point {field_name} at a larger disk"
    if free < needed:
        return fail(name, text, fix + ".", free=free, needed=needed)
    if free < 2 * needed:
        return warn(name, text + "; under 2x that", fix + " before a long run.", free=free, needed=needed)
    return ok(name, text, free=free, needed=needed)


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            return err.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def check_ports(ports: list[int]) -> CheckResult:
    """Fixed ports the run or its server will bind must be free; the rest take free ports (port 0)."""
    name = "ports"
    used = [p for p in ports if port_in_use(p)]
    if used:
        return fail(
            name,
            f"port(s) {used} already in use",
            "stop what listens there or choose another port.",
            used=used,
        )
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
    except OSError as err:
        return fail(
            name,
            f"cannot bind a free local port ({err})",
            "allow local TCP ports: the trainer ranks and weight transport rendezvous on them.",
        )
    if ports:
        return ok(name, f"port(s) {ports} free; free ephemeral ports available")
    return ok(
        name, "the config binds no fixed port (rendezvous and MASTER_PORT take free ones); binding works"
    )


# ------------------------------------------------------------------------------------------- rendering
def find_render_library() -> str | None:
    """The first of libEGL / libOSMesa the dynamic loader finds, or None."""
    for lib in RENDER_LIBRARIES:
        found = ctypes.util.find_library(lib)
        if found:
            return found
    return None


def check_rendering(renderers: list[str]) -> CheckResult:
    """Environments whose class sets `needs_rendering = True` need EGL or OSMesa for headless rendering."""
    name = "rendering (EGL/OSMesa)"
    if not renderers:
        return skipped(name, "no environment of this config renders (needs_rendering)")
    lib = find_render_library()
    if lib is None:
        return fail(
            name,
            f"{', '.join(renderers)} render(s) but neither libEGL nor libOSMesa is installed",
            "install libegl1 (GPU) or libosmesa6 (CPU) and set PYOPENGL_PLATFORM=egl or osmesa.",
        )
    return ok(name, f"{lib} for {', '.join(renderers)}", library=lib)


def check_simulator_rendering(
    simulators: list[str], probe: Callable[[], tuple[str | None, str]] = probe_renderer
) -> CheckResult:
    """Simulator environments (`ascent.envs.sim`) render frames (rows with `render`/`image_obs`) through
    MuJoCo's EGL or OSMesa: `probe` renders a tiny scene in a subprocess. No renderer is a warning, not a
    failure: state-only rows need none."""
    name = "simulator rendering (MuJoCo)"
    if not simulators:
        return skipped(name, "no simulator environment in this config")
    if importlib.util.find_spec("mujoco") is None:
        return warn(
            name,
            "mujoco is not installed: frames cannot be rendered (state-only rows still run)",
            "pip install 'ascent[sim]'.",
        )
    backend, said = probe()
    if backend is None:
        return warn(
            name,
            f"no MuJoCo renderer works here ({said}); state-only rows still run",
            "apt-get install libegl1 libegl-mesa0 (or libosmesa6) and set MUJOCO_GL=egl (or osmesa).",
        )
    return ok(name, f"MUJOCO_GL={backend} renders ({', '.join(simulators)})", backend=backend)
