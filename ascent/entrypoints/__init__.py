"""What the `ascent` command runs (design: "Package map"): each module is one sub-command's body, called by
`ascent.cli` with a validated config. `train` opens the run directory and drives the RL loop of
`ascent.orchestrator.loop`; `sft` fine-tunes on prompt/response pairs with the same trainer workers;
`evaluate` scores a checkpoint on a dataset. The orchestrator below them holds the loop's stages, not entry
points.
"""
