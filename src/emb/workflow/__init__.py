"""What the workflow decides while Snakemake parses it: every function and check the
``.smk`` files call, in one package (the DAG's decisions, tested as Python)."""
