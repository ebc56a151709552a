"""AsyncLM on the client side: the session runner (:mod:`.session`) and the tools it executes (:mod:`.tools`)."""
