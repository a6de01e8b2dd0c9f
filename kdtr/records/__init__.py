"""What kdtree writes and the provenance it carries: the base of verify's and bench's records and the
one place a record's kind is told, which every reader goes through (`record`), the JSON, JUnit XML
and CSV writers with each record's meta (the command, the code's digest, git, the machine and its
GPU: `report`) and `kdtree doctor`'s facts (`doctor`). It may import the root modules and
`kdtr.runtime`, and nothing else of kdtr."""
