"""`ascent doctor`: checks before a long run, each with a status and the fix, and a memory estimate per GPU
(or of the machine's RAM for a run on the CPU).

Map: report.py (a check's result, the table, JSON, exit status) <- system.py (Python, torch, CUDA, GPU
capability, NCCL, host memory, disk, ports, EGL/OSMesa), cluster.py (Ray), tracking.py (W&B, MLflow),
data.py (dataset files and their first rows), model.py (config, tokenizer, fast-engine architecture,
rendering environments), memory.py (the pure arithmetic of the memory estimate) and plan.py (run config ->
its inputs) <- run.py (all checks in order). The command itself is `ascent.entrypoints.doctor`;
`bench/memory_estimate.py` compares the estimate with a measured iteration. These are inspection tools
above the orchestrator: they read the config, the first rows of the data and the model directory (never
the hub), never build workers.
"""

from ascent.doctor.memory import Estimate, MemoryInputs, ModelShape, estimate
from ascent.doctor.report import CheckResult
from ascent.doctor.run import DoctorReport, run_checks

__all__ = ["CheckResult", "DoctorReport", "Estimate", "MemoryInputs", "ModelShape", "estimate", "run_checks"]
