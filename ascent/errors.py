"""The user-facing error base class shared by every package.

Raise a subclass of `AscentError` for problems the user can fix (a bad config value, a malformed dataset
row, a missing checkpoint). Its message is one readable paragraph per problem that names the field or file,
the bad value and the fix. The `ascent` command prints it as `error: <message>` without a traceback and
exits with code 2 (`ASCENT_DEBUG=1` shows the traceback too). Anything else is a bug: traceback, exit 1.

Imports nothing, so every layer (config, data, rewards, ...) can subclass it without import cycles.
"""

from __future__ import annotations


class AscentError(Exception):
    """A problem the user can fix; the message says what and how. The CLI exits with `exit_code`."""

    exit_code: int = 2
