"""Built-in tasks with data the project generates (no network; a seed gives the same data anywhere): each
module writes a task's data and rows, and holds its environment.

- `sql_task`: a shop database and text-to-SQL questions; environment `text_to_sql` (a read-only `sql` tool).
- `search_task`: an encyclopedia of made-up entities, its BM25 index and one- or two-hop questions;
  environment `search_qa` (a `search` tool).
- `guess_task`: ranges and numbers for the `guess_number` game (`ascent.envs.base.GuessNumber`).

Each has `make_*_task(out_dir, n_rows, seed) -> rows path` and a command line,
`python -m ascent.envs.tasks.sql_task OUT --rows 400 --seed 0` (`--shape skyrl` writes SkyRL-gym's rows).
"""

from ascent.envs.tasks.guess_task import make_guess_task
from ascent.envs.tasks.search_task import make_search_task
from ascent.envs.tasks.sql_task import make_sql_task

__all__ = ["make_guess_task", "make_search_task", "make_sql_task"]
