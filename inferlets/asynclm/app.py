"""asynclm: asynchronous function calling (AsyncLM) as an inferlet.

Argument: one JSON object (the ``oven asynclm`` command builds it):
  task            the user's request (required)
  mode            async | async-naive | sync | sync-parallel (default async)
  stateless       sync modes: re-prefill after every wait, as over a serving API
  functions       the function definitions for the prompt, with estimated execution times
  adapter         the LoRA adapter to decode with, by name (`oven asynclm` gives "asynclm", the fine-tuned
                  CML adapter); absent: the base model
  example         put a worked example in the system prompt (for a model not fine-tuned on CML)
  estimates_ms    {function name: estimated execution time}, for LPT and the trap handler
  plan            pinned calls as chains [["f(1)", "g(2)"], ["h()"]] (the paper's cheat sheet)
  kv              auto (the server's interception policy places the KV, told the expected wait) | keep |
                  offload | drop while waiting at a trap (default auto)
  call_grammar    a Lark grammar of a call's text after [HEAD] up to [END] (`oven asynclm --constrain`: the tools'
                  schemas); every call is then named and held to it
  max_tokens (sampled, not pinned), answer_tokens, call_timeout_ms, http_url (send calls over HTTP instead),
  report_context  put the final context's token ids in the done event

Every event goes to the client as a JSON message: text, call, intr, trap, kv, malformed,
error, and finally done with the session's statistics.
"""

import json

import inferlet
from agent import Agent, report


async def main(args: list[str]) -> None:
    if len(args) != 1:
        raise ValueError("usage: asynclm SPEC_JSON (see the module doc; `oven asynclm` builds it)")
    spec = json.loads(args[0])
    stats = await Agent(spec).run()
    report({"type": "done", **stats})


WitWorld = inferlet.run(main)
