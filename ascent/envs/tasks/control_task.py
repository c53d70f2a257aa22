"""Rows for the simulator environment `gym` (`ascent.envs.sim`): one control task, a seed per row.

`make_control_task(out_dir, n_rows, seed, task=...)` writes `rows.jsonl` and `val.jsonl`, each row
`{"prompt", "gym_id", "seed", "max_steps", "bins", "decimals", "success_rule", "env": "gym"}`; a row's `seed` fixes
its initial state, so the `samples_per_prompt` episodes of its group start alike (GRPO compares them). The
tasks (`TASKS`):

- `cartpole`: CartPole-v1 (two actions), kept up for 20 steps is a success; state to 1 decimal.
- `pendulum`: Pendulum-v1 (a torque in 16 bins), 20 steps; success: a return of -20 or more (upright and
  still most of the time; a random policy scores about -30 from a random start).
- `inverted_pendulum`: MuJoCo's InvertedPendulum-v5 (a force in 16 bins), kept up for 20 steps.
- `reach`: `ascent.envs.sim.reach` (a point steps left or right to a target 1 or 2 cells away, 3 steps at
  most; success: reaching it); the state is the target's offset, so the right action is plain to learn.
- `reach_pixels`: the same with the frame as the only observation (an image part; the text leaves the state
  out), a pixel task for a vision-language or VLA policy.

Short episodes keep a tiny model's turns on a CPU cheap; a row may set its own `max_steps`, `bins`,
`render`. `image_obs=True` (`--image-obs`) adds `"image_obs": true` to every row: each observation shows the
rendered frame beside the state's text (a VLA's pixel observations; examples/embodied/vla.yaml). Command line: `python -m ascent.envs.tasks.control_task OUT --task cartpole --rows 400 --seed 0`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ascent.envs.tasks.common import Shape, n_val_rows, write_split

REACH = "ascent.envs.sim.reach:Reach-v0"  # registered by that module (imported by gymnasium, where made)

TASKS: dict[str, dict[str, Any]] = {
    "cartpole": {"gym_id": "CartPole-v1", "max_steps": 20, "decimals": 1, "success_rule": "survive"},
    "pendulum": {
        "gym_id": "Pendulum-v1",
        "max_steps": 20,
        "bins": 16,
        "decimals": 1,
        "success_return": -20.0,
    },
    "inverted_pendulum": {"gym_id": "InvertedPendulum-v5", "max_steps": 20, "bins": 16, "decimals": 2},
    "reach": {"gym_id": REACH, "max_steps": 3, "decimals": 0, "success_rule": "goal"},
    "reach_pixels": {"gym_id": REACH, "max_steps": 3, "success_rule": "goal", "pixels_only": True},
}


def control_rows(task: str, seeds: Sequence[int], image_obs: bool = False) -> list[dict[str, Any]]:
    """One row per seed of `task` (a key of TASKS); with `image_obs`, observations show rendered frames."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not a control task; choose one of {', '.join(TASKS)}")
    preset = TASKS[task] | ({"image_obs": True} if image_obs else {})
    return [
        {"prompt": f"{preset['gym_id']} from seed {s}", **preset, "seed": int(s), "env": "gym"} for s in seeds
    ]


def make_control_task(
    out_dir: str | Path,
    n_rows: int,
    seed: int = 0,
    *,
    n_val: int | None = None,
    shape: Shape = "ascent",
    task: str = "cartpole",
    image_obs: bool = False,
) -> Path:
    """Write `rows.jsonl` (`n_rows` seeds of `task`) and `val.jsonl` (`n_val`, default a tenth) to `out_dir`;
    return the path of `rows.jsonl`. The simulator seeds are distinct draws from `seed`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    total = n_rows + n_val_rows(n_rows, n_val)
    rows = control_rows(task, rng.sample(range(1_000_000), total), image_obs)
    return write_split(out, rng, rows, n_rows, total, shape)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write rows of a simulator control task: a seed each.")
    parser.add_argument("out", type=Path, help="the folder to write the rows to")
    parser.add_argument("--task", choices=sorted(TASKS), default="cartpole", help="the control task")
    parser.add_argument("--rows", type=int, default=400, help="training rows (default 400)")
    parser.add_argument("--val", type=int, default=None, help="validation rows (default: a tenth of --rows)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the drawn seeds (default 0)")
    parser.add_argument("--image-obs", action="store_true", help="show rendered frames as observations")
    args = parser.parse_args(argv)
    rows = make_control_task(
        args.out, args.rows, args.seed, n_val=args.val, task=args.task, image_obs=args.image_obs
    )
    print(f"wrote {rows} and {rows.with_name('val.jsonl')}")


if __name__ == "__main__":
    main()
