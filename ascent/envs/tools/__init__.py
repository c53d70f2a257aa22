"""Tools an environment gives the model (design: "Environments and tools"): each runs with a limit and
returns a `ToolResult` whose text is the observation, failures included. `python`: code in a limited process
without network; `data`: read-only SQL and BM25 full-text search; `calls`: plain functions as tools, and
the model's `<tool_call>` blocks."""

from ascent.envs.tools.calls import FunctionTool, ToolCall, function_tool, parse_tool_calls
from ascent.envs.tools.data import SearchIndex, run_sql
from ascent.envs.tools.python import Limits, SandboxUnavailableError, ToolResult, run_python

__all__ = [
    "FunctionTool",
    "Limits",
    "SandboxUnavailableError",
    "SearchIndex",
    "ToolCall",
    "ToolResult",
    "function_tool",
    "parse_tool_calls",
    "run_python",
    "run_sql",
]
