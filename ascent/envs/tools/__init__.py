"""Tools an environment gives the model (design: "Environments and tools"): each runs with a timeout and
returns a `ToolResult` whose text is the observation, failures included. `python`: code in a limited
process without network."""

from ascent.envs.tools.python import Limits, SandboxUnavailableError, ToolResult, run_python

__all__ = ["Limits", "SandboxUnavailableError", "ToolResult", "run_python"]
