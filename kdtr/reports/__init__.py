"""What people look at, made from records: the self-contained HTML page of verify and bench records
(`html_report`, drawing with `svg_plot`), matplotlib plots of a bench record (`plot`), records of
different GPUs side by side (`gpu_compare`) and the roofline floors of the bench suites on the GPUs
kdtree knows (`roofline`). It may import the root modules, `kdtr.runtime`, `kdtr.scaleout`,
`kdtr.records`, `kdtr.ops`, `kdtr.impl`, `kdtr.bundle`, `kdtr.verify` and `kdtr.bench`, and nothing
else of kdtr; no package of kdtr imports it."""
