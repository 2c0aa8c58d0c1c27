"""Kafka outside the worker: topics, the wire codec, publishing history and the SRE console."""
