"""The errors a worker group raises: each names the group, the rank, the method and what to do next."""

from __future__ import annotations

from pathlib import Path

from ascent.errors import AscentError

TIMEOUT_HINT = (
    "If the work is just slow, raise cluster.worker_timeout_s. If it hangs in weight sync or another "
    "NCCL collective, check NCCL_SOCKET_IFNAME (the network interface the nodes share) and that the nodes "
    "reach each other; NCCL_DEBUG=INFO shows where it stops."
)


def _log_hint(log_path: Path | None) -> str:
    return f" (worker log: {log_path})" if log_path is not None else ""


class ClusterConfigError(AscentError, ValueError):
    """The cluster settings cannot work (too many inline workers, more GPUs than the cluster has, ...)."""


class WorkerError(RuntimeError):
    """A worker's method raised. The worker's own exception is `__cause__` (inline) or in the message
    (Ray)."""

    def __init__(
        self,
        group: str,
        rank: int,
        method: str,
        error: str,
        *,
        log_path: Path | None = None,
        details: str = "",
    ) -> None:
        self.group, self.rank, self.method, self.error, self.log_path = group, rank, method, error, log_path
        message = f"worker group '{group}' rank {rank}: {method} raised {error}{_log_hint(log_path)}"
        super().__init__(message + (f"\n{details}" if details else ""))


class WorkerTimeoutError(TimeoutError):
    """A worker call did not finish within the group's timeout."""

    def __init__(self, group: str, method: str, timeout_s: float, pending_ranks: list[int]) -> None:
        self.group, self.method, self.timeout_s, self.pending_ranks = group, method, timeout_s, pending_ranks
        super().__init__(
            f"worker group '{group}': {method} did not finish within {timeout_s:g}s on ranks {pending_ranks} "
            f"(cluster.worker_timeout_s={timeout_s:g}). {TIMEOUT_HINT}"
        )


class WorkerDiedError(RuntimeError):
    """A worker process is gone (crash, out-of-memory kill, lost node)."""

    def __init__(
        self, group: str, rank: int, method: str, reason: str, *, log_path: Path | None = None
    ) -> None:
        self.group, self.rank, self.method, self.log_path = group, rank, method, log_path
        super().__init__(
            f"worker group '{group}' rank {rank} died during {method} ({reason}){_log_hint(log_path)}. "
            "A crash without a Python traceback (segfault, out-of-memory kill) shows in Ray's worker logs "
            "under /tmp/ray/session_latest/logs (worker-*.err) and in `dmesg`."
        )
