"""The client side of oven: a separate program from the control process.

The ``oven`` command line (:mod:`.cli`, :mod:`.commands`; finding the server:
:mod:`.connect`; what ``oven run X`` means: :mod:`.programs`), the client library
(:mod:`.rpc`), inferlet build tooling and templates (:mod:`.build`, :mod:`.pycheck`,
found through :mod:`.paths`), the OpenAI-compatible API (:mod:`.openai_api`), greedy
generation straight over the inference protocol (:mod:`.generate`), and the
AsyncLM session runner with its tool executor and BFCL tooling (:mod:`.asynclm`).
Nothing here imports torch.
"""
