"""Bundles and the cases in them: the KDTR container (`format`), YAML suites validated into cases
(`yamldoc`, `spec`), gen-refs turning cases into golden bundles (`refs`), bundles saved from an
engine's live tensors (`capture`), a bundle read back as a case checked against its op (`case`),
what `kdtree inspect` shows (`summary`), the host memory a case takes (`memory`) and the walk that
finds bundles and suites in folders (`walk`). It may import the root modules, `kdtr.scaleout`,
`kdtr.records`, `kdtr.ops` and `kdtr.impl`, and nothing else of kdtr."""
