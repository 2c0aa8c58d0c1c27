"""``faultstream agent``: the node agent that follows a GPU node's kernel log (and optionally its
DCGM counters) and publishes them to the input topics through an on-disk spool."""
