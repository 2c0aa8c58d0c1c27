"""``faultstream receive``: Prometheus remote_write into the input topics."""
