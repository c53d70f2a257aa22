"""Simulators as environments (embodied RL; design: "Environments and tools"): gymnasium's tasks, classic
control and MuJoCo, played by a language model one step per turn.

`actions`: the action tokenizer (continuous dimensions in bins, discrete spaces by index, as words);
`gym_env`: `GymEnv` (registered as `gym`), a row's simulator with state vectors as text, optional frames,
success and episode length in `info`; `vector`: `SimVectorEnvs`, a batch's episodes stepped together through
`SyncVectorEnv`; `hosted`: `HostedSimEnvs`, blocks of those copies stepped inside host processes or Ray
actors (a crash costs its block, the host is replaced); `reach`: a tiny task with a plain state -> action
map, in state and in pixels; `frames`: image strips, GIFs and the renderer probe of `ascent doctor`. The built-in tasks'
rows (seeds) are written by `ascent.envs.tasks.control_task`. gymnasium and mujoco are the `sim` extra and
are imported when a simulator is made, not here.
"""

from ascent.envs.sim.actions import ActionTokenizer
from ascent.envs.sim.gym_env import GymEnv, SimSpec
from ascent.envs.sim.hosted import HostedSimEnvs
from ascent.envs.sim.vector import SimVectorEnvs

__all__ = ["ActionTokenizer", "GymEnv", "HostedSimEnvs", "SimSpec", "SimVectorEnvs"]
