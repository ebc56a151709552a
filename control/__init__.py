"""Control and application layer: CLI, inference clients, (later) the inferlet runtime."""
