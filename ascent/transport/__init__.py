"""Weight transport: versioned publication of the trainer's weights to the rollout replicas (design.md,
"One controller, plain workers"). `buckets` is the wire format, `weights` the process-to-process links.
The experience store lives here too: `store` (schema and reader of `<run_dir>/experience.db`) and
`store_writer` (the loop's background writer)."""
