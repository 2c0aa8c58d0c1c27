"""Contracts of faultstream: input and output records, JSON Schemas, ClickHouse DDL.

Nothing in this package performs I/O; every other package speaks these types.
"""
