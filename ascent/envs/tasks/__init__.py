"""Built-in tasks with data the project generates (no network; a seed gives the same data anywhere): each
module writes a task's data and rows, and holds its environment.

- `sql_task`: a shop database and text-to-SQL questions; environment `text_to_sql` (a read-only `sql` tool).
- `search_task`: an encyclopedia of made-up entities, its BM25 index and one- or two-hop questions;
  environment `search_qa` (a `search` tool).
- `guess_task`: ranges and numbers for the `guess_number` game (`ascent.envs.base.GuessNumber`).
- `zoom_task`: large synthetic images whose answer is a detail seen only when zoomed in; environment `zoom_qa`
  (a `zoom_in` tool that returns images: `ascent.envs.image_env`), or `image_qa` without it
  (`--env image_qa`). Rows carry their image as a PNG data URI.
- `control_task`: seeds of a simulator control task (CartPole, Pendulum, MuJoCo's InvertedPendulum) for the
  `gym` environment (`ascent.envs.sim`).

Each has `make_*_task(out_dir, n_rows, seed) -> rows path` and a command line,
`python -m ascent.envs.tasks.sql_task OUT --rows 400 --seed 0` (`--shape skyrl` writes SkyRL-gym's rows).
Rows name their files (`db_path`, `index_path`) relative to the rows file, so a data folder can be moved or
copied to another machine; `ascent.data.load_rows` makes them absolute.

The generators are imported on first use (`__getattr__`), not here: `python -m ascent.envs.tasks.sql_task`
imports this package first, and a submodule it had already imported would run twice (runpy warns about it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ascent.envs.tasks.control_task import make_control_task
    from ascent.envs.tasks.guess_task import make_guess_task
    from ascent.envs.tasks.search_task import make_search_task
    from ascent.envs.tasks.sql_task import make_sql_task
    from ascent.envs.tasks.zoom_task import make_zoom_task

GENERATORS = {
    "make_control_task": "control_task",
    "make_guess_task": "guess_task",
    "make_search_task": "search_task",
    "make_sql_task": "sql_task",
    "make_zoom_task": "zoom_task",
}
__all__ = ["make_control_task", "make_guess_task", "make_search_task", "make_sql_task", "make_zoom_task"]


def __getattr__(name: str) -> Any:
    if name not in GENERATORS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{GENERATORS[name]}"), name)
