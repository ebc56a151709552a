"""The control process: wasmtime host and inferlet lifecycle (``runtime/``), resource tables
(``resources/``), the batch scheduler and dispatch policies (``scheduling/``), the client-facing
RPC server, and the inference process it starts and talks to."""
