"""The application layer: inferlet programs in wasmtime, their host imports, and the control loop."""
