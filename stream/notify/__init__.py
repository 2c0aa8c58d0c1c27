"""Where incidents leave faultstream for people: ``faultstream notify`` (Alertmanager)."""
