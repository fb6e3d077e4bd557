"""The CLI job: read -> the processor -> Parquet; the run's paths, plan and summary as values,
its input and rows, the Parquet files it writes, and series (fingerprints, last outputs, store)."""
