"""The Kafka worker: Faust wiring, partition state, commit points, checkpoints, metrics."""
