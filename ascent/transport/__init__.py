"""Weight transport: versioned publication of the trainer's weights to the rollout replicas (design.md,
"One controller, plain workers"). `publish` is the one protocol (`Publisher.publish(version)` on the
controller, a `Sender` / `Receiver` on the workers of a link); `inline`, `object_store`, `broadcast` and
`cuda_ipc` are the ways of moving weights, one module each, chosen in `select`; `weights` is what the two
links share, `buckets` their wire format; `pinned` keeps one publication for a judge pinned at a policy
version (`reward.judge.model=policy@N`). The experience store's writer lives here too: `store_writer` (the
loop's background writer of `<run_dir>/experience.db`; the format and the reader are
`ascent.tracking.experience_store`)."""
