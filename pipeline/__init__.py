"""The pipeline, by layer (each imports only from those below it): job/ (the CLI job: read ->
processor -> Parquet, runs and series), llm/ (ray.data.llm's API and its stage of actors), engines/
(vLLM with our proposer, and our own decoder), config/ (typed settings, drafter kinds and registry,
model loading). docs/layout.md has the map."""
