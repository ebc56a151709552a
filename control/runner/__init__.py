"""Runner processes: where inferlets' WebAssembly runs, out of the control loop's process (one runner
per client), so that a tenant's CPU, memory, address space and crashes stay its own."""
