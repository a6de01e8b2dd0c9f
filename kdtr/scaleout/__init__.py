"""Scale-out without a cluster, for CI and for several GPUs: deterministic shards of a run (`parallel`),
which shard a job is (`--shard I/N`, a scheduler's variables, `--balance-from`: `shards`), one worker
process per GPU and bounded thread pools (`parallel`). It may import the root modules and
`kdtr.records` (`--balance-from` reads an earlier verify or bench record through its one kind
dispatch), and nothing else of kdtr."""
