"""The client side of oven: a separate program from the control process.

The ``oven`` command line (:mod:`.cli`, :mod:`.commands`), the client library
(:mod:`.rpc`), inferlet build tooling and templates (:mod:`.build`), greedy
generation straight over the inference protocol (:mod:`.generate`), and the
AsyncLM session runner with its tool executor and BFCL tooling (:mod:`.asynclm`).
Nothing here imports torch.
"""
